pytest_plugins = ["temporality_testing.fixtures"]
