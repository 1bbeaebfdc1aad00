import pytest
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from trainer.data import DataError, build_loaders
from trainer.data.dataset import ImageDataset, collate_images
from trainer.data.folder import FolderSource
from trainer.data.transforms import random_resized_crop_box
from trainer.data.worker_processes import forkserver
from trainer.settings.train_config import DEFAULTS


def folder_config(root, **extra):
    values = dict(
        data="folder",
        data_dir=str(root),
        image_size=32,
        batch_size=4,
        num_classes=3,
        loader_workers=0,
    )
    return DEFAULTS.replace(**{**values, **extra})


def test_loader_yields_normalized_batches_from_jpeg_and_png(image_folder):
    loaders = build_loaders(folder_config(image_folder), 0, 1, torch.device("cpu"), False)
    images, labels = next(iter(loaders.train))
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
    assert -3.0 < float(images.mean()) < 3.0
    assert set(labels.tolist()) <= {0, 1, 2}
    assert loaders.batches_per_epoch == 18 // 4
    assert loaders.val is not None


def test_two_ranks_read_disjoint_files(image_folder):
    seen = []
    for rank in (0, 1):
        loaders = build_loaders(folder_config(image_folder), rank, 2, torch.device("cpu"), False)
        seen.append({index for index, _ in loaders.train.sampler})
    assert not seen[0] & seen[1]


def test_augmentation_depends_only_on_seed_epoch_and_index(image_folder):
    dataset = ImageDataset(FolderSource(image_folder / "train"), 32, train=True, seed=3)
    assert torch.equal(dataset[(5, 1)][0], dataset[(5, 1)][0])
    assert not torch.equal(dataset[(5, 1)][0], dataset[(5, 2)][0])


def test_forkserver_workers_give_the_same_batches(image_folder):
    device = torch.device("cpu")
    inline = build_loaders(folder_config(image_folder), 0, 1, device, False).train
    workers = build_loaders(folder_config(image_folder, loader_workers=2), 0, 1, device, False)
    assert workers.train.loader.multiprocessing_context.get_start_method() == "forkserver"
    for (a, la), (b, lb) in zip(inline, workers.train, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    # Persistent workers left to interpreter exit hold it up until their watchdog notices.
    workers.train.stop_workers()


class StridedSamples(Dataset):
    """(image, label, problem) samples laid out as the transforms leave them: crops of NHWC
    memory, a flipped one, and one in plain (3, H, W) memory."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        pixels = torch.randint(0, 256, (9, 9, 3), dtype=torch.uint8, generator=generator)
        image = pixels.permute(2, 0, 1)
        image = [
            image[:, 1:6, 2:9],
            image[:, :5, :7].flip(-1),
            image[:, 2:7, 1:8].contiguous(),
            image[:, 4:, 2:],
        ][index % 4]
        return image, index, "bad.jpg" if index == 5 else ""


@pytest.mark.parametrize("workers", [0, 1])
def test_image_batches_are_collated_into_nhwc_memory(workers):
    """The same values as PyTorch's default collate, in channels_last memory; from a loader
    worker the batch is in shared memory, so it reaches this process without a copy."""
    context = forkserver() if workers else None
    loader = DataLoader(
        StridedSamples(),
        4,
        num_workers=workers,
        multiprocessing_context=context,
        collate_fn=collate_images,
    )
    expected = DataLoader(StridedSamples(), 4, collate_fn=default_collate)
    for (images, labels, problems), (want, want_labels, want_problems) in zip(
        loader, expected, strict=True
    ):
        assert torch.equal(images, want) and images.dtype == torch.uint8
        assert images.is_contiguous(memory_format=torch.channels_last)
        assert images.is_shared() == bool(workers)
        assert torch.equal(labels, want_labels) and labels.dtype == torch.int64
        assert problems == list(want_problems)


def test_batches_reach_the_device_in_the_memory_format_the_model_uses(image_folder):
    """In this process: a loader worker's batches are the same NHWC tensors, in shared memory
    (``test_image_batches_are_collated_into_nhwc_memory``)."""
    config = folder_config(image_folder)
    plain = build_loaders(config, 0, 1, torch.device("cpu"), False).train
    nhwc = build_loaders(config, 0, 1, torch.device("cpu"), True).train
    # The loader's own batches are NHWC, so a channels_last model takes them as they come.
    collated = next(iter(plain.loader))[0]
    assert collated.dtype == torch.uint8
    assert collated.is_contiguous(memory_format=torch.channels_last)
    for (a, labels_a), (b, labels_b) in zip(plain, nhwc, strict=True):
        assert a.is_contiguous() and b.is_contiguous(memory_format=torch.channels_last)
        assert not b.is_contiguous()
        assert torch.equal(a, b) and torch.equal(labels_a, labels_b)


def test_crop_box_stays_inside_the_image():
    generator = torch.Generator().manual_seed(1)
    for _ in range(200):
        left, top, right, bottom = random_resized_crop_box(50, 30, generator)
        assert 0 <= left < right <= 50 and 0 <= top < bottom <= 30


def test_unusable_folders_are_named(tmp_path, image_folder):
    with pytest.raises(DataError, match="does not exist"):
        build_loaders(folder_config(tmp_path / "missing"), 0, 1, torch.device("cpu"), False)
    (tmp_path / "empty" / "train" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match=r"no \.jpg/\.jpeg/\.png images"):
        build_loaders(folder_config(tmp_path / "empty"), 0, 1, torch.device("cpu"), False)
    with pytest.raises(DataError, match="set --num-classes 3"):
        build_loaders(folder_config(image_folder, num_classes=2), 0, 1, torch.device("cpu"), False)


def test_corrupt_image_names_the_file(image_folder):
    victim = sorted((image_folder / "train" / "class0").iterdir())[0]
    victim.write_bytes(b"not an image")
    source = FolderSource(image_folder / "train")
    dataset = ImageDataset(source, 32, train=True, seed=0)
    index = next(i for i, (path, _) in enumerate(source.samples) if path == str(victim))
    with pytest.raises(DataError, match=victim.name):
        dataset[(index, 0)]


def test_too_few_images_for_the_batch_names_the_folder(image_folder):
    with pytest.raises(DataError, match=r"18 images in .*train give no full batch of 16"):
        build_loaders(folder_config(image_folder, batch_size=16), 0, 2, torch.device("cpu"), False)


def test_samples_stay_uint8_until_the_device_normalizes_them(image_folder):
    from trainer.data.transforms import IMAGENET_MEAN, IMAGENET_STD, normalize

    dataset = ImageDataset(FolderSource(image_folder / "train"), 32, train=True, seed=0)
    image, _ = dataset[(0, 0)]
    assert image.dtype == torch.uint8 and image.shape == (3, 32, 32)
    batch = normalize(image.unsqueeze(0))
    expected = (image[0].float() / 255 - IMAGENET_MEAN[0]) / IMAGENET_STD[0]
    assert torch.allclose(batch[0, 0], expected, atol=1e-5)


def test_eval_transform_resizes_the_short_side_then_center_crops():
    from trainer.data.transforms import eval_transform

    pixels = torch.zeros(100, 200, 3, dtype=torch.uint8)
    pixels[:, 100:] = 255  # right half white
    out = eval_transform(pixels, 56)  # short side -> 64, then a 56 center crop of 64x128
    assert out.shape == (3, 56, 56)
    assert out[:, :, :20].max() == 0 and out[:, :, -20:].min() == 255
