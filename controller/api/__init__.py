"""`ffswarm api`: the HTTP front door for tenants (docs/api.md). Importing this package imports no
web framework: the config reads controller/api/settings.py on every command."""
