"""Shared test code: builders of runs, logs, models and servers that more than one test module uses.

Test modules import from here (and from ``sorl_monitor``), never from one another or from a ``conftest``;
``conftest.py`` files hold fixtures only. ``*_child.py`` modules run as child processes
(``python -m tests.helpers.<name>``).
"""
