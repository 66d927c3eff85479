"""The README's two set-up commands are the ones CI and users actually run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    setup = text.split("## Set-up: two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", setup)


def test_readme_has_exactly_two_setup_commands_and_pins_torch_first():
    commands = readme_commands()
    assert len(commands) == 2, commands
    for command in commands:
        assert command.startswith("pip install torch==2.13.0 && "), command


def test_ci_runs_the_readme_test_command_verbatim():
    test_command = readme_commands()[1]
    assert "pytest" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_readme_main_command_runs_classification_of_the_default_model():
    assert readme_commands()[0].endswith("headlens classify")
