"""The file-system broker behind ``fs_op`` steps."""
