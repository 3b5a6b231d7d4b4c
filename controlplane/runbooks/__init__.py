"""Runbooks: the registered scripts under runbooks/, run by the server with validated arguments and no shell.

`catalog` finds the scripts and reads their declarations, `declaration` checks a declaration and a
run's arguments, `runner` records runs, applies the two-person rule and one run per target, and
`process` supervises one script. `readmodel` describes runs for the API and the console, and `api`
is the HTTP side; both use the composition root's runner (`Services.runbooks`).
"""
