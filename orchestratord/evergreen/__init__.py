"""The Evergreen front door: sessions as runs, actions as steps."""
