"""Optional parts of the install (pyproject's extras): a command that needs one that is missing
says in one line which extra to install, instead of a ModuleNotFoundError traceback."""

from __future__ import annotations

from controller.errors import MissingExtra

# The top-level modules the controller imports only from an extra, by the extra that installs them.
MODULE_EXTRA = {
    "starlette": "api",
    "uvicorn": "api",
    "python_multipart": "api",
    "multipart": "api",
    "jwt": "api",
    "cryptography": "api",
    "PIL": "api",  # Pillow: the web page's thumbnails
    "boto3": "s3",
    "botocore": "s3",
}


def missing_extra(error: ModuleNotFoundError, command: str | None) -> MissingExtra | None:
    """What to tell the user when ``command`` failed on ``error``: which extra to install, or None
    when the missing module belongs to no extra (a broken install, left as it is)."""
    module = (error.name or "").partition(".")[0]
    extra = MODULE_EXTRA.get(module)
    if extra is None:
        return None
    who = f"`ffswarm {command}`" if command else "this command"
    install = f"pip install 'ffswarm[{extra}]'"
    return MissingExtra(f'{who} needs the "{extra}" extra ({module} is not installed): {install}')
