"""Generator checkpoints, offline: fake upstream repositories and fake network pickles.

Each fake upstream has the layout the real code needs to unpickle (``dnnlib/``,
``torch_utils/``, ``training/networks.py``, and ``legacy.py`` for StyleGAN2-ADA)
and is packed as GitHub packs a commit (``<repo>-<commit>/`` in a .tar.gz). The
archive and a pickle built exactly as upstream's training loop writes it
(``{'G': ..., 'D': ..., 'G_ema': ...}``, EDM: ``{'ema': ...}``) are served on
127.0.0.1, fetched with the lock file, extracted with safe_extract, and used.
The fake networks leave traces (a marker file when unpickled, a log line per
forward call) so the tests can see what ran.
"""

import importlib
import importlib.util
import io
import pickle
import sys
import tarfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from distrank.data import fetch, read_lockfile, safe_extract
from distrank.zoo.checkpoints import UntrustedPickleError, edm_sample, generate_from_checkpoint
from distrank.zoo.upstream import EDM, PLUGINS, STYLEGAN2_ADA, find_code_root, upstream_code


def _load_data_conftest():
    # The loopback HTTP server of the data tests; loaded by path since both test
    # folders have a conftest.py.
    path = Path(__file__).parents[1] / "data" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_distrank_data_conftest", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


http_server = _load_data_conftest().http_server  # a fixture
FAST = {"backoff": 0.0, "timeout": 5, "allow_http": True}  # the local server is plain http

# --- fake upstream sources ---------------------------------------------------------------------

TRACES = '''
import os

def trace(env, text=None):
    """Touch or append to the file named by $env, if set."""
    path = os.environ.get(env)
    if path:
        with open(path, "a") as handle:
            handle.write(text or "")
'''

STYLEGAN_NETWORKS = """
import torch
from torch_utils import trace

class Generator(torch.nn.Module):
    def __init__(self, z_dim, c_dim, w_dim, img_resolution, img_channels):
        super().__init__()
        self.z_dim, self.c_dim, self.w_dim = z_dim, c_dim, w_dim
        self.img_resolution, self.img_channels = img_resolution, img_channels
        self.mapping = torch.nn.Linear(z_dim + c_dim, w_dim)
        self.synthesis = torch.nn.Linear(w_dim, img_channels * img_resolution ** 2)
        self.register_buffer("w_avg", torch.randn(w_dim))

    def forward(self, z, c, truncation_psi=1, truncation_cutoff=None, noise_mode="random"):
        trace("FAKE_FORWARD_LOG", f"{truncation_psi} {noise_mode} {len(z)}\\n")
        w = self.mapping(torch.cat([z.to(torch.float32), c.to(torch.float32)], dim=1))
        w = self.w_avg.lerp(w, truncation_psi)
        img = 1.5 * torch.tanh(self.synthesis(w))  # beyond [-1, 1], as real outputs can be
        # Batch-dependent like real fp16 networks, which fuse modulated convolutions only
        # at batch 1: the images must come from one-image passes, as in generate.py.
        img = img + 0.05 * (len(z) - 1)
        return img.reshape(-1, self.img_channels, self.img_resolution, self.img_resolution)

    def __setstate__(self, state):
        trace("FAKE_UNPICKLED")
        super().__setstate__(state)

class Discriminator(torch.nn.Module):
    pass
"""

LEGACY = """
import pickle
import dnnlib

def load_network_pkl(f, force_fp16=False):
    data = pickle.Unpickler(f).load()
    for key in ("G", "D", "G_ema"):
        assert key in data, key
    data.setdefault("training_set_kwargs", None)
    data.setdefault("augment_pipe", None)
    return data
"""

EDM_NETWORKS = '''
import torch
from torch_utils import trace

class EDMPrecond(torch.nn.Module):
    """The ideal denoiser of Gaussian data N(mean[class], sigma_data^2)."""

    def __init__(self, img_resolution, img_channels, label_dim=0, sigma_data=0.5):
        super().__init__()
        self.img_resolution, self.img_channels = img_resolution, img_channels
        self.label_dim = label_dim
        self.sigma_data, self.sigma_min, self.sigma_max = sigma_data, 0, float("inf")
        self.register_buffer("means", torch.linspace(-0.5, 0.5, max(label_dim, 1)))

    def forward(self, x, sigma, class_labels=None, force_fp32=False):
        trace("FAKE_FORWARD_LOG", f"{float(sigma):.6g} {len(x)}\\n")
        mean = 0 if class_labels is None else (class_labels.to(x.dtype) @ self.means.to(x.dtype))
        mean = torch.as_tensor(mean, dtype=x.dtype).reshape(-1, 1, 1, 1)
        s2 = self.sigma_data ** 2
        return (mean + (x - mean) * s2 / (sigma ** 2 + s2)).to(torch.float32)

    def round_sigma(self, sigma):
        return torch.as_tensor(sigma)

    def __setstate__(self, state):
        trace("FAKE_UNPICKLED")
        super().__setstate__(state)
'''


def fake_upstream(root: Path, upstream, networks: str, *, legacy: bool) -> Path:
    """Write a fake source tree at root/<name>-<commit>/ and return it."""
    tree = root / upstream.top_folder
    files = {
        "dnnlib/__init__.py": "class EasyDict(dict):\n    pass\n",
        "torch_utils/__init__.py": TRACES,
        "training/__init__.py": "",
        "training/networks.py": networks,
        "README.md": f"fake {upstream.repo}\n",
    }
    if legacy:
        files["legacy.py"] = LEGACY
    for name, text in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(textwrap.dedent(text))
    return tree


def github_archive(tree: Path, commit: str) -> bytes:
    """A .tar.gz laid out like GitHub's archive of a commit (pax header with the commit)."""
    buffer = io.BytesIO()
    with tarfile.open(
        fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT, pax_headers={"comment": commit}
    ) as tar:
        tar.add(tree, arcname=tree.name)
    return buffer.getvalue()


def network_pickle(tree: Path, build) -> bytes:
    """Pickle what ``build(networks_module)`` returns, importing the fake code by hand."""
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    sys.path.insert(0, str(tree))
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return pickle.dumps(build(importlib.import_module("training.networks")))
    finally:
        sys.path[:] = saved_path
        for name in set(sys.modules) - saved_modules:
            del sys.modules[name]


def stylegan_pickle(tree: Path, *, c_dim=0) -> bytes:
    def build(networks):
        G = networks.Generator(z_dim=6, c_dim=c_dim, w_dim=5, img_resolution=4, img_channels=3)
        return {
            "G": G,
            "D": networks.Discriminator(),
            "G_ema": G.eval(),
            "training_set_kwargs": {"path": "afhqcat.zip"},
            "augment_pipe": None,
        }

    return network_pickle(tree, build)


def edm_pickle(tree: Path, *, label_dim=0) -> bytes:
    def build(networks):
        return {
            "ema": networks.EDMPrecond(img_resolution=4, img_channels=3, label_dim=label_dim),
            "loss_fn": None,
            "augment_pipe": None,
            "dataset_kwargs": {},
        }

    return network_pickle(tree, build)


@pytest.fixture
def traces(tmp_path, monkeypatch):
    unpickled, forward = tmp_path / "unpickled.marker", tmp_path / "forward.log"
    monkeypatch.setenv("FAKE_UNPICKLED", str(unpickled))
    monkeypatch.setenv("FAKE_FORWARD_LOG", str(forward))

    def forward_calls():
        return forward.read_text().splitlines() if forward.exists() else []

    return unpickled, forward_calls


def download(http_server, tmp_path, upstream, pkl_name, *, networks, legacy, build):
    """Serve the fake repo archive and pickle, then fetch and extract them as the pipeline does."""
    tree = fake_upstream(tmp_path / "src", upstream, networks, legacy=legacy)
    owner_repo = upstream.repo
    code_url = http_server.put(
        f"{owner_repo}/archive/{upstream.commit}.tar.gz", github_archive(tree, upstream.commit)
    )
    pkl_url = http_server.put(f"pretrained/{pkl_name}", build(tree))
    lock = tmp_path / "resources" / "checksums.lock"
    downloads = tmp_path / "resources" / "downloads"
    code = fetch(code_url, downloads / "code", lockfile=lock, **FAST)
    code_dir = safe_extract(code, downloads / "code.d")
    pkl = fetch(pkl_url, downloads / pkl_name, lockfile=lock, **FAST)
    assert set(read_lockfile(lock)) == {code_url, pkl_url}  # no hash published: recorded
    return pkl, code_dir


@pytest.fixture
def stylegan(http_server, tmp_path):
    return download(
        http_server,
        tmp_path,
        STYLEGAN2_ADA,
        "afhqcat.pkl",
        networks=STYLEGAN_NETWORKS,
        legacy=True,
        build=stylegan_pickle,
    )


def reference_images(pkl, code_root, seeds, psi, labels=None):
    """Independent computation: unpickle by hand, z per seed as upstream generate.py."""
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    sys.path.insert(0, str(code_root))
    try:
        G = pickle.loads(pkl.read_bytes())["G_ema"]
        out = []
        for i, seed in enumerate(seeds):
            z = torch.from_numpy(np.random.RandomState(seed).randn(1, G.z_dim))
            c = torch.zeros([1, G.c_dim])
            if labels is not None:
                c[0, labels[i]] = 1
            with torch.no_grad():
                img = G(z, c, truncation_psi=psi, noise_mode="const")
            out.append((img.permute(0, 2, 3, 1) * 127.5 + 128).clamp(0, 255).to(torch.uint8))
        return torch.cat(out).numpy()
    finally:
        sys.path[:] = saved_path
        for name in set(sys.modules) - saved_modules:
            del sys.modules[name]


# --- StyleGAN2-ADA -----------------------------------------------------------------------------


def test_pinned_upstreams():
    for upstream in (STYLEGAN2_ADA, EDM):
        assert len(upstream.commit) == 40 and int(upstream.commit, 16) >= 0
    assert STYLEGAN2_ADA.archive_url == (
        "https://github.com/NVlabs/stylegan2-ada-pytorch/archive/"
        "6f160b3d22b8b178ebe533a50d4d5e63aedba21d.tar.gz"
    )
    assert STYLEGAN2_ADA.top_folder == (
        "stylegan2-ada-pytorch-6f160b3d22b8b178ebe533a50d4d5e63aedba21d"
    )


def test_refuses_untrusted_pickle_before_loading_it(stylegan, traces):
    pkl, code_dir = stylegan
    unpickled, forward_calls = traces
    path_before = list(sys.path)
    with pytest.raises(UntrustedPickleError, match=r"afhqcat\.pkl.*runs code.*trust_pickles: true"):
        generate_from_checkpoint(pkl, code_dir, n=2, seed=0)
    assert not unpickled.exists() and forward_calls() == []
    assert "training" not in sys.modules and "legacy" not in sys.modules
    assert sys.path == path_before


def test_generates_seeded_images_and_restores_sys_path(stylegan, traces, tmp_path):
    pkl, code_dir = stylegan
    unpickled, forward_calls = traces
    path_before, modules_before = list(sys.path), set(sys.modules)

    images, labels = generate_from_checkpoint(
        pkl,
        code_dir,
        n=5,
        seed=3,
        truncation_psi=0.7,
        batch_size=2,
        device="cpu",
        trust_pickles=True,
    )
    assert images.shape == (5, 4, 4, 3) and images.dtype == np.uint8 and labels is None
    assert unpickled.exists()
    assert forward_calls() == ["0.7 const 1"] * 5  # one image per pass, as generate.py
    assert sys.path == path_before
    assert not {"training", "training.networks", "legacy", "dnnlib", "torch_utils"} & set(
        sys.modules
    )
    new_modules = [sys.modules[name] for name in set(sys.modules) - modules_before]
    assert not [
        m for m in new_modules if Path(getattr(m, "__file__", None) or "/").is_relative_to(tmp_path)
    ]

    code_root = code_dir / STYLEGAN2_ADA.top_folder
    np.testing.assert_array_equal(images, reference_images(pkl, code_root, range(3, 8), 0.7))
    assert images.min() == 0 and images.max() == 255  # clamped like upstream

    # Image i depends only on seed + i: not on n, batch size, or the code_dir spelling.
    again, _ = generate_from_checkpoint(
        pkl,
        code_root,
        n=3,
        seed=4,
        truncation_psi=0.7,
        batch_size=3,
        device="cpu",
        trust_pickles=True,
    )
    np.testing.assert_array_equal(again, images[1:4])
    other_seed, _ = generate_from_checkpoint(
        pkl, code_dir, n=5, seed=100, truncation_psi=0.7, device="cpu", trust_pickles=True
    )
    assert not np.array_equal(other_seed, images)

    # Truncation reaches the network: psi = 0 maps every latent to the average.
    collapsed, _ = generate_from_checkpoint(
        pkl, code_dir, n=4, seed=3, truncation_psi=0.0, device="cpu", trust_pickles=True
    )
    assert (collapsed == collapsed[0]).all()
    assert forward_calls()[-1] == "0.0 const 1"


def test_conditional_network_labels(http_server, tmp_path, traces):
    pkl, code_dir = download(
        http_server,
        tmp_path,
        STYLEGAN2_ADA,
        "cifar10.pkl",
        networks=STYLEGAN_NETWORKS,
        legacy=True,
        build=lambda tree: stylegan_pickle(tree, c_dim=4),
    )
    images, labels = generate_from_checkpoint(
        pkl, code_dir, n=40, seed=0, batch_size=16, device="cpu", trust_pickles=True
    )
    expected = [_label_after_z(s, z_dim=6, n_classes=4) for s in range(40)]
    assert labels.dtype == np.int64 and labels.tolist() == expected
    assert set(labels.tolist()) == {0, 1, 2, 3}
    code_root = find_code_root(code_dir)
    np.testing.assert_array_equal(images, reference_images(pkl, code_root, range(40), 1.0, labels))

    fixed, fixed_labels = generate_from_checkpoint(
        pkl, code_dir, n=3, seed=0, class_idx=2, device="cpu", trust_pickles=True
    )
    assert fixed_labels.tolist() == [2, 2, 2]
    np.testing.assert_array_equal(fixed, reference_images(pkl, code_root, range(3), 1.0, [2] * 3))
    with pytest.raises(ValueError, match=r"'class_idx' must be in 0\.\.3"):
        generate_from_checkpoint(
            pkl, code_dir, n=1, seed=0, class_idx=4, device="cpu", trust_pickles=True
        )


def _label_after_z(seed, z_dim, n_classes):
    rs = np.random.RandomState(seed)
    rs.randn(1, z_dim)
    return rs.randint(n_classes)


def test_unconditional_network_rejects_class(stylegan):
    pkl, code_dir = stylegan
    with pytest.raises(ValueError, match="unconditional network; class_idx must be None"):
        generate_from_checkpoint(
            pkl, code_dir, n=1, seed=0, class_idx=1, device="cpu", trust_pickles=True
        )
    with pytest.raises(ValueError, match=r"^argument 'noise_mode' must be "):
        generate_from_checkpoint(
            pkl, code_dir, n=1, seed=0, noise_mode="loud", device="cpu", trust_pickles=True
        )


def test_code_dir_must_be_an_upstream_tree(stylegan, tmp_path):
    pkl, _ = stylegan
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not an upstream source tree"):
        generate_from_checkpoint(pkl, tmp_path / "empty", n=1, seed=0, trust_pickles=True)
    with pytest.raises(FileNotFoundError, match=r"network pickle .*missing\.pkl"):
        generate_from_checkpoint(
            tmp_path / "missing.pkl", tmp_path, n=1, seed=0, trust_pickles=True
        )


def test_upstream_code_shadows_and_restores_modules(tmp_path):
    tree = fake_upstream(tmp_path, STYLEGAN2_ADA, STYLEGAN_NETWORKS, legacy=True)
    sentinel = type(sys)("dnnlib")
    sys.modules["dnnlib"] = sentinel
    try:
        with upstream_code(tree):
            import dnnlib

            assert dnnlib is not sentinel and Path(dnnlib.__file__).parent == tree / "dnnlib"
        assert sys.modules["dnnlib"] is sentinel
    finally:
        del sys.modules["dnnlib"]


def test_stylegan_images_do_not_depend_on_batch_size_or_chunks(stylegan, traces):
    """The fake network shifts every pixel at batch > 1 (as fp16 networks do): the
    images of every batch size and chunking are generate.py's one-seed images."""
    pkl, code_dir = stylegan
    code_root = code_dir / STYLEGAN2_ADA.top_folder
    reference = reference_images(pkl, code_root, range(10, 18), 1.0)
    for batch in (1, 3, 8):
        images, _ = generate_from_checkpoint(
            pkl, code_dir, n=8, seed=10, batch_size=batch, device="cpu", trust_pickles=True
        )
        np.testing.assert_array_equal(images, reference)
    chunks = [
        generate_from_checkpoint(
            pkl, code_dir, n=n, seed=10 + start, batch_size=8, device="cpu", trust_pickles=True
        )[0]
        for start, n in ((0, 3), (3, 5))
    ]
    np.testing.assert_array_equal(np.concatenate(chunks), reference)


CUSTOM_OPS = """
import importlib
import torch.utils.cpp_extension

_cached_plugins = dict()

def get_plugin(module_name, sources, **build_kwargs):
    # Upstream's 6f160b3 torch_utils/custom_ops.py, reduced to what fails under torch 2.x:
    # load() builds and returns the module, then it is imported by name.
    if module_name in _cached_plugins:
        return _cached_plugins[module_name]
    torch.utils.cpp_extension.load(name=module_name, verbose=False, sources=sources, **build_kwargs)
    module = importlib.import_module(module_name)
    _cached_plugins[module_name] = module
    return module
"""


def test_cuda_plugins_load_with_the_module_that_load_returns(tmp_path, monkeypatch):
    """Item 1, on the CPU: torch 2.x's load() returns the plugin without registering it
    in sys.modules; upstream's import by name fails, the patched get_plugin does not."""
    import torch.utils.cpp_extension

    built = []

    def load(name, sources, verbose=False, **kwargs):  # torch 2.x: returns, registers nothing
        built.append(name)
        return type(sys)(name)

    monkeypatch.setattr(torch.utils.cpp_extension, "load", load)
    tree = fake_upstream(tmp_path, STYLEGAN2_ADA, STYLEGAN_NETWORKS, legacy=True)
    (tree / "torch_utils" / "custom_ops.py").write_text(CUSTOM_OPS)

    saved = list(sys.path)
    sys.path.insert(0, str(tree))  # upstream as it is, unpatched: the build "succeeds"...
    try:
        with pytest.raises(ModuleNotFoundError, match="fake_plugin"):  # ...the import fails
            importlib.import_module("torch_utils.custom_ops").get_plugin("fake_plugin", [])
    finally:
        sys.path[:] = saved
        for name in [n for n in sys.modules if n.partition(".")[0] == "torch_utils"]:
            del sys.modules[name]

    with upstream_code(tree):
        from torch_utils import custom_ops

        plugin = custom_ops.get_plugin("fake_plugin", sources=["fake.cu"])
        assert plugin.__name__ == "fake_plugin" and sys.modules["fake_plugin"] is plugin
        assert custom_ops.get_plugin("fake_plugin", sources=["fake.cu"]) is plugin  # cached
    assert built == ["fake_plugin", "fake_plugin"] and "fake_plugin" in PLUGINS
    assert "fake_plugin" not in sys.modules and torch.utils.cpp_extension.load is load
    assert (tree / "torch_utils" / "custom_ops.py").read_text() == CUSTOM_OPS  # not edited


def test_upstream_code_drops_modules_made_by_persistence(tmp_path):
    """Item 5: torch_utils.persistence exec()s pickled source into _imported_module_<hex>."""
    tree = fake_upstream(tmp_path, STYLEGAN2_ADA, STYLEGAN_NETWORKS, legacy=True)
    with upstream_code(tree):
        sys.modules["_imported_module_0123abcd"] = type(sys)("_imported_module_0123abcd")
    assert not [name for name in sys.modules if name.startswith("_imported_module_")]


# --- EDM ---------------------------------------------------------------------------------------


def test_edm_sampler_against_closed_form(http_server, tmp_path, traces):
    """For Gaussian data N(m, s^2) the probability-flow ODE has the exact solution
    x(t) = m + (x(T) - m) sqrt(t^2 + s^2) / sqrt(T^2 + s^2); Heun must land close to it."""
    pkl, code_dir = download(
        http_server,
        tmp_path,
        EDM,
        "edm-cifar10-32x32-cond-vp.pkl",
        networks=EDM_NETWORKS,
        legacy=False,
        build=lambda tree: edm_pickle(tree, label_dim=3),
    )
    _, forward_calls = traces
    images, labels = generate_from_checkpoint(
        pkl, code_dir, n=5, seed=7, batch_size=4, num_steps=100, device="cpu", trust_pickles=True
    )
    assert images.shape == (5, 4, 4, 3) and images.dtype == np.uint8
    assert len(forward_calls()) == 2 * (2 * 100 - 1)  # two batches, 2N - 1 evaluations each
    assert sys.modules.get("training") is None

    s, T, means = 0.5, 80.0, np.linspace(-0.5, 0.5, 3)
    for i, (image, label) in enumerate(zip(images, labels)):
        gen = torch.Generator("cpu").manual_seed(7 + i)
        z = torch.randn([3, 4, 4], generator=gen).double().numpy()
        assert label == torch.randint(3, size=[], generator=gen).item()
        m = means[label]
        x0 = m + (T * z - m) * s / np.sqrt(T**2 + s**2)
        expected = np.clip(x0.transpose(1, 2, 0) * 127.5 + 128, 0, 255)
        assert np.abs(image - expected).max() <= 1.5  # < 1 from the uint8 cast, ~0.4 from Heun

    with pytest.raises(ValueError, match="EDM network, which has no truncation"):
        generate_from_checkpoint(
            pkl, code_dir, n=1, seed=0, truncation_psi=0.5, device="cpu", trust_pickles=True
        )


class GaussianDenoiser:
    """The ideal denoiser of N(0, s^2) data, as a plain callable with EDM's attributes."""

    sigma_min, sigma_max, s2 = 0.0, float("inf"), 0.25

    def round_sigma(self, sigma):
        return torch.as_tensor(sigma)

    def __call__(self, x, sigma, class_labels=None):
        return x * self.s2 / (sigma**2 + self.s2)


def test_edm_sample_is_second_order():
    z = torch.randn(200, 3, 2, 2, generator=torch.Generator().manual_seed(0))
    exact = 80 * z.double() * 0.5 / np.sqrt(80**2 + 0.25)
    errors = [
        float((edm_sample(GaussianDenoiser(), z, num_steps=n) - exact).abs().max())
        for n in (25, 100)
    ]
    assert errors[1] < 5e-3 and errors[0] / errors[1] > 4**2 * 0.7  # Heun: O(h^2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_generation(http_server, tmp_path):
    sg_pkl, sg_code = download(
        http_server,
        tmp_path / "sg",
        STYLEGAN2_ADA,
        "cifar10.pkl",
        networks=STYLEGAN_NETWORKS,
        legacy=True,
        build=lambda tree: stylegan_pickle(tree, c_dim=4),
    )
    edm_pkl, edm_code = download(
        http_server,
        tmp_path / "edm",
        EDM,
        "edm-cifar10.pkl",
        networks=EDM_NETWORKS,
        legacy=False,
        build=lambda tree: edm_pickle(tree, label_dim=3),
    )
    results = {}
    for pkl, code in ((sg_pkl, sg_code), (edm_pkl, edm_code)):
        runs = [
            generate_from_checkpoint(
                pkl,
                code,
                n=6,
                seed=1,
                batch_size=batch,
                num_steps=4,
                device="cuda",
                trust_pickles=True,
            )
            for batch in (6, 4)
        ]
        (images, labels), (again, again_labels) = results[pkl.name] = runs
        assert images.shape == (6, 4, 4, 3) and labels.shape == (6,)
        np.testing.assert_array_equal(images, again)
        np.testing.assert_array_equal(labels, again_labels)
    # StyleGAN2-ADA latents and labels come from numpy: the same on every device.
    cpu, cpu_labels = generate_from_checkpoint(
        sg_pkl, sg_code, n=6, seed=1, device="cpu", trust_pickles=True
    )
    cuda, cuda_labels = results["cifar10.pkl"][0]
    np.testing.assert_array_equal(cpu_labels, cuda_labels)
    assert np.abs(cpu.astype(int) - cuda).max() <= 1


def test_two_upstreams_in_one_process(http_server, tmp_path, traces):
    """StyleGAN2-ADA's and EDM's trees both define dnnlib, torch_utils and training."""
    sg_pkl, sg_code = download(
        http_server,
        tmp_path / "sg",
        STYLEGAN2_ADA,
        "ffhq.pkl",
        networks=STYLEGAN_NETWORKS,
        legacy=True,
        build=stylegan_pickle,
    )
    edm_pkl, edm_code = download(
        http_server,
        tmp_path / "edm",
        EDM,
        "edm-ffhq-64x64-uncond-vp.pkl",
        networks=EDM_NETWORKS,
        legacy=False,
        build=edm_pickle,
    )
    for pkl, code in ((sg_pkl, sg_code), (edm_pkl, edm_code), (sg_pkl, sg_code)):
        images, labels = generate_from_checkpoint(
            pkl, code, n=2, seed=0, num_steps=4, device="cpu", trust_pickles=True
        )
        assert images.shape == (2, 4, 4, 3) and labels is None
    with pytest.raises((AttributeError, ModuleNotFoundError, AssertionError)):
        # EDM's tree cannot unpickle a StyleGAN2-ADA network: its training.networks differs.
        generate_from_checkpoint(sg_pkl, edm_code, n=1, seed=0, device="cpu", trust_pickles=True)
    assert "training" not in sys.modules
