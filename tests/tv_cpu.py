"""torchvision (and timm) for the tests on the CPU build of torch: see
`stitchml.bench.vision`, which the models suite's vision rows use too."""
from stitchml.bench.vision import FOLDER, import_torchvision  # noqa: F401
