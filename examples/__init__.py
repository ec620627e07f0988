"""Programs written against the SDK as users write them (the tests run them)."""
