"""The `plain_answer` handler: one reply, no tools, graded by the math-answer reward."""
