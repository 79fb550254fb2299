"""The `math` handler (`handler`) and the math-answer reward it and `plain_answer` grade with:
math-verify in a warm grading process (`answer`), the sympy fallback for Python-style answers
(`sympy_fallback`)."""
