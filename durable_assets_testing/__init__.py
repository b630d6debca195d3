"""Development and testing tools for durable-assets, kept out of the runtime package.

Nothing under ``durable_assets`` imports this package (``tests/test_architecture.py`` holds that),
except ``job provider serve``, which loads the simulator when, and only when, it is asked to run
it. A deployment that never starts the simulator never loads a line of it.
"""
