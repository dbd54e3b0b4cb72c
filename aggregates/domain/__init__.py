"""The API domain teams write against: aggregate types and their handlers, schema
evolution (upcasters, state migrations) and side effects (``Effects``). Pure.

docs/design.md "Layout of the library" says which room may import which."""
