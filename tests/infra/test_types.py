"""pyright over the Azure program against the installed azure-native types: 0 errors."""

import subprocess
import sys
from pathlib import Path

from tests.infra.conftest import REPO


def test_pyright_reports_no_errors():
    pyright = Path(sys.executable).parent / "pyright"
    result = subprocess.run(
        [str(pyright), "--outputjson"], capture_output=True, text=True, timeout=600, cwd=REPO
    )
    assert '"errorCount": 0' in result.stdout, result.stdout[-4000:]
    assert '"filesAnalyzed": 0' not in result.stdout
