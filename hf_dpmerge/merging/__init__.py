"""merging subpackage."""
