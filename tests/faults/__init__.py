"""The fault campaign of issue 15 as a test suite (`make test-faults`; part of `make test`)."""
