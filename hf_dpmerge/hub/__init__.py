"""hub subpackage."""
