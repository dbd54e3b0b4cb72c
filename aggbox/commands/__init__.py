"""The sub-commands of the pipeline and the dispatcher: ``aggbox run`` / ``aggbox stream``
(:mod:`aggbox.commands.run`) and ``aggbox dispatch`` (:mod:`aggbox.commands.dispatch`).

They live in the command-line layer, not in ``spark`` / ``dispatcher``: that is where a
missing MongoDB URI becomes the embedded local server and where Maven resolves jars
(docs/design.md, "Layering"). Settings become flags through :mod:`aggbox.commands.options`.
"""
