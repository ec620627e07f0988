"""Pools of engine replicas: the registry (health, slots, identity), the pools file, routes."""
