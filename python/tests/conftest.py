"""pytest configuration: report which fa4 package and libfa4 are under test."""

import pytest


def pytest_report_header(config):
    try:
        import fa4

        return (f"fa4 package: {fa4.__file__}; libfa4 {fa4.version()} at {fa4.library_path()} "
                f"(cuda kernels: {fa4.has_cuda()})")
    except Exception as e:  # the tests themselves will fail loudly with the reason
        return f"fa4: not loadable: {e}"
