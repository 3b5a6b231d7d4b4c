"""Runbooks: the registered scripts under runbooks/, run by the server with validated arguments and no shell.

`catalog` finds the scripts and reads their declarations, `declaration` checks a declaration and a
run's arguments, `runner` records runs, applies the two-person rule and one run per target, and
`process` supervises one script. `api` is the HTTP side.
"""
