pytest_plugins = ["tests.testbed.fixtures"]
