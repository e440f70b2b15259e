"""torch.save / torch.load with tern tensors and map_location."""

import torch


def test_save_load_tensor(tmp_path):
    host = torch.randn(4, 5)
    path = tmp_path / "t.pt"
    torch.save({"a": host.to("tern"), "b": host.to("tern:1")[1:3]}, path)
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu["a"].device.type == "cpu" and torch.equal(on_cpu["a"], host)
    assert torch.equal(on_cpu["b"], host[1:3])
    kept = torch.load(path)
    assert kept["a"].device == torch.device("tern:0")
    assert kept["b"].device == torch.device("tern:1")
    assert torch.equal(kept["b"].cpu(), host[1:3])
    moved = torch.load(path, map_location="tern")
    assert moved["b"].device.type == "tern" and torch.equal(moved["b"].cpu(), host[1:3])
    to1 = torch.load(path, map_location="tern:1")
    assert to1["a"].device == torch.device("tern:1") and torch.equal(to1["a"].cpu(), host)


def test_save_cpu_load_to_tern(tmp_path):
    model = torch.nn.Linear(3, 2)
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)
    state = torch.load(path, map_location="tern")
    assert all(v.device.type == "tern" for v in state.values())
    other = torch.nn.Linear(3, 2).to("tern")
    other.load_state_dict(state)
    assert torch.equal(other.weight.cpu(), model.weight.detach())
