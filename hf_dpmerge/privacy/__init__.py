"""The released privacy record and the base-weights fingerprint it carries."""
