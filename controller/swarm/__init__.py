"""The Swarm: ffswarm's view of it as types and a protocol (backend.py), the one adapter over
docker-py (docker.py, admin.py: the only importers of docker), and the pure data that becomes
services and stack files (servicespec.py, render.py, gpuconfig.py, imageref.py)."""
