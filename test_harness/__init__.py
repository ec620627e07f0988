"""Fake engines for every protocol, fault injection and load generators, for tests and benches."""
