#!/usr/bin/env bash
# Build trainer/data/jpeg_region.c (decoding only a training crop's region of a JPEG) into the
# environment of PYTHON, where trainer/data/jpeg_region.py loads it. Needs a C compiler and
# libjpeg-turbo's headers (Debian and Ubuntu: libjpeg-dev). Usage: build_jpeg_region.sh PYTHON
# with the trainer importable (the repository or the image's PYTHONPATH). Prints the library.
set -euo pipefail
python=$1

# The module alone, not the trainer.data package, which imports the whole input pipeline: the
# image's builder stage runs this with an interpreter that has numpy but not the pipeline's
# other requirements.
read -r source library digest < <("$python" -c '
import importlib.util, pathlib
package = importlib.util.find_spec("trainer").submodule_search_locations[0]
path = pathlib.Path(package, "data", "jpeg_region.py")
spec = importlib.util.spec_from_file_location("jpeg_region", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(module.SOURCE, module.LIBRARY, module.source_digest())')
cc=${CC:-cc}
if ! echo '#include <stdio.h>
#include <jpeglib.h>' | "$cc" -E -x c - >/dev/null 2>&1; then
  echo "error: jpeglib.h not found: install libjpeg-turbo's headers (libjpeg-dev) and rerun" >&2
  exit 1
fi
mkdir -p "$(dirname "$library")"
# Built beside its final name and renamed: a process loading it never sees half a library.
"$cc" -O2 -Wall -Wextra -shared -fPIC -DJPEG_REGION_SOURCE="\"$digest\"" \
  -o "$library.partial" "$source" -ljpeg
mv -f "$library.partial" "$library"
echo "$library"
