"""The `code` handler: programming problems graded by hidden tests (`handler`), the grader that
runs each test in the EVAL sandbox (`grading`)."""
