"""Primitives every room may use: errors, reason codes, settings, key and id derivation,
partitions, field-name rules, small I/O helpers (bulk writes, store-error classes, files,
URIs, backoff) and the W3C trace-context parser. Imports no other room.

docs/design.md "Layout of the library" says which room may import which."""
