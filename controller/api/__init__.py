"""`ffswarm api`: the HTTP front door for tenants (docs/api.md). Its config sections (``api:``,
``tenants:``) are parsed by controller/apiconfig.py, below the config, so no other command imports
anything of this package."""
