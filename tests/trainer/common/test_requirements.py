"""A team's requirements.txt against the packages the image holds: the lines no version the image
has can satisfy, as pip reads the file (comments, continuations, markers, options)."""

from __future__ import annotations

import pytest

from trainer.common.requirements import conflicts, requirement_lines

HAVE = {"numpy": "2.4.6", "torch": "2.13.0+cu130", "pyyaml": "6.0.3", "tensorboard": "2.20.0"}


def test_only_lines_the_images_versions_miss_are_conflicts():
    text = (
        "# pins of the team\n"
        "numpy<2  # the old API\n"
        "torch>=2.0\n"  # a local version (+cu130) satisfies a public specifier
        "PyYAML==6.0.3\n"  # names compare canonically
        "tensorboard\\\n"
        "   ==2.19.0\n"  # one requirement over two lines: numbered by its first
        "scipy==1.14\n"  # not the image's: pip installs it
    )
    found = conflicts(text, HAVE)
    assert [(c.line, c.requirement, c.name, c.have) for c in found] == [
        (2, "numpy<2", "numpy", "2.4.6"),
        (5, "tensorboard==2.19.0", "tensorboard", "2.20.0"),
    ]
    assert str(found[0]) == "line 2 `numpy<2` excludes the image's numpy 2.4.6"


def test_a_direct_url_for_a_package_the_image_holds_would_replace_it():
    (found,) = conflicts("torch @ https://example.org/torch-2.1.0-cp313-none-any.whl\n", HAVE)
    assert (found.line, found.name) == (1, "torch")


@pytest.mark.parametrize(
    ("line", "python", "conflict"),
    [
        ('numpy<2 ; python_version < "3.12"', "3.13", False),
        ('numpy<2 ; python_version < "3.12"', "3.11", True),
        ("numpy[dev]<2", "3.13", True),
    ],
)
def test_a_line_counts_only_where_its_marker_holds(line, python, conflict):
    found = conflicts(line + "\n", HAVE, {"python_version": python})
    assert bool(found) is conflict


def test_options_paths_and_urls_are_left_to_pip():
    text = (
        "--index-url https://pypi.example.org/simple\n-r more.txt\n-c pins.txt\n-e ./lib\n"
        "./wheels/team-0.1-py3-none-any.whl\n/abs/wheel.whl\n"
        "https://example.org/numpy-1.0.tar.gz\ngit+https://example.org/numpy.git\n"
        "not a requirement !!\n"
    )
    assert list(requirement_lines(text)) == []
    assert conflicts(text, HAVE) == []
