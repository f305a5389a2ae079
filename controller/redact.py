"""What ffswarm may show of text it did not write: names, reasons, URLs and hook output.

File names and reasons come from the shared volume and from users, so they may hold terminal escapes
(a name that clears the screen or retitles the window when printed); URLs and hook output may hold
credentials. Everything printed to a terminal or written to a reason file passes through here:
``printable`` for names and reasons, ``url`` for webhook URLs, ``secrets`` for hook output.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# C0 and C1 controls, DEL, and the Unicode bidi overrides and line separators that reorder or break
# what a terminal shows. Tab and newline are kept where a caller allows them (reason files).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CONTROL_NL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_SECRETS = re.compile(
    r"(?i)((?:token|secret|password|passwd|pwd|key|auth\w*|bearer)\s*[=:]?\s*)\S+"
    r"|[A-Za-z0-9+/_=-]{24,}"  # long opaque strings: keys, tokens, hashes
)
_OPAQUE_SEGMENT = re.compile(r"[A-Za-z0-9+_=-]{16,}")  # a token as a URL path segment (…/services/T0/B0/xyz…)


def _escape(m: re.Match[str]) -> str:
    c = m.group(0)
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def printable(text: str, *, newlines: bool = False) -> str:
    """``text`` with every control character written as an escape (``\\x1b``), so that printing it
    moves no cursor and sets no title. ``newlines``: keep newlines and tabs (multi-line reasons)."""
    return (_CONTROL if newlines else _CONTROL_NL).sub(_escape, text)


def secrets(text: str) -> str:
    """``text`` with anything that looks like a secret (``token=…``, long opaque strings) replaced."""
    return _SECRETS.sub(lambda m: (m.group(1) or "") + "[redacted]", text)


def url(text: str) -> str:
    """A URL as logs and reports may show it: scheme://host[:port]/path, without user, password,
    query or fragment, and with token-like path segments replaced (``…/hooks/[redacted]``)."""
    try:
        parts = urlsplit(text)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "[unparsable URL]"
    path = "/".join(_OPAQUE_SEGMENT.sub("[redacted]", seg) for seg in parts.path.split("/"))
    extra = "?…" if parts.query or parts.fragment else ""
    shown = f"{parts.scheme}://{host}{port}{path}{extra}" if parts.scheme else "[not a URL]"
    return printable(shown)
