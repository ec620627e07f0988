"""API types of the v1 wire contract: requests, responses, events, errors.

Imported by the server, the test harness and clients; imports none of them.
"""
