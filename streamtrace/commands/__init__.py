"""The ``streamtrace`` commands: ``cli.main`` parses the command line and runs one command's
module (``serve``, ``demo``, ``learn_demo``, ``bench``; ``evaluate``, ``replay``, the bridges,
``export``, ``dashboard``, ``worker`` and ``cluster`` live with the packages they drive).

>>> from streamtrace.commands.cli import COMMANDS
>>> COMMANDS["bench"]
'streamtrace.commands.bench'
"""
