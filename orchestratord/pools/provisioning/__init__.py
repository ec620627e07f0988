"""Provisioning (PLACE-5002): engines started on this host on an admin's request, registered
as a pool once healthy, stopped when the pool is deleted or idle past its TTL.

- ``request.py``: what ``POST /v1/pools/provision`` takes.
- ``processes.py``: an engine server as a child process (a free port, health, stop).
- ``provisioners.py``: the registry of provisioners, one class per way of starting engines.
- ``manager.py``: the bound, the pools this process started, their idle TTL.
"""
