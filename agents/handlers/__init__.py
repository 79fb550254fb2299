"""Built-in handlers, one package per handler: `<name>/handler.py` registers it, beside its
reward and helpers. Importing this package registers nothing (a grading child process that
imports `agents.handlers.math.answer` stays light); `agents.registry.load_builtin_handlers`
imports each handler module."""
