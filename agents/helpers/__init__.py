"""What handlers share but that is not a handler: SWE repos, diffs, images and grading, the
search tools, the code grader. Kept beside `agents/handlers/` (whose every module registers
a handler) so the handler package holds handlers only."""
