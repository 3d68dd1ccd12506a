"""The released privacy record, the base-weights fingerprint it carries, and the empirical privacy audit."""
