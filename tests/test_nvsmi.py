from conftest import FIXTURES

from gpulab.probe import nvsmi


def test_topology_from_seed_with_nv4():
    t = nvsmi.parse_topology((FIXTURES / "topo_nv4.txt").read_text())
    assert t.devices == ["GPU0", "GPU1"]
    assert t.matrix == [["X", "NV4"], ["NV4", "X"]]
    assert t.nvlink_count("GPU0", "GPU1") == 4
    assert t.affinity["GPU0"] == {"CPU Affinity": "0-127", "NUMA Affinity": "N/A", "GPU NUMA ID": "N/A"}
    assert t.legend["SYS"].startswith("Connection traversing PCIe as well as the SMP")
    assert "NV#" in t.legend


def test_topology_tab_separated_real_format():
    text = ("\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            "GPU0\t X \tNV18\tSYS\t0-47,96-143\t0\t\tN/A\n"
            "GPU1\tNV18\t X \tSYS\t0-47,96-143\t0\t\tN/A\n"
            "GPU2\tSYS\tSYS\t X \t48-95\t1\t\tN/A\n\nLegend:\n\n  X    = Self\n")
    t = nvsmi.parse_topology(text)
    assert t.devices == ["GPU0", "GPU1", "GPU2"]
    assert t.link("GPU0", "GPU1") == "NV18" and t.link("GPU2", "GPU0") == "SYS"
    assert t.affinity["GPU2"]["CPU Affinity"] == "48-95"
    assert t.affinity["GPU2"]["NUMA Affinity"] == "1"


def test_topology_real_h200_output_with_ansi_underline():
    # Captured on the lent H200 (driver 580.159.04): the header is wrapped in ESC[4m ... ESC[0m.
    t = nvsmi.parse_topology((FIXTURES / "topo_h200_single.txt").read_text())
    assert t.devices == ["GPU0"] and t.matrix == [["X"]]
    assert t.affinity["GPU0"]["CPU Affinity"] == "0-15"
    assert t.affinity["GPU0"]["NUMA Affinity"] == "0"


def test_topology_rejects_garbage():
    import pytest

    with pytest.raises(ValueError, match="no topology header"):
        nvsmi.parse_topology("nothing here")


def test_nvlink_status_from_seed():
    gpus = nvsmi.parse_nvlink_status((FIXTURES / "nvlink_status.txt").read_text())
    assert [g["index"] for g in gpus] == [0, 1]
    assert gpus[0]["name"] == "NVIDIA RTX A5000"
    assert gpus[1]["uuid"] == "GPU-8d513fbe-2239-85cd-c234-61a58ccdd468"
    assert sorted(gpus[0]["links"]) == [0, 1, 2, 3]
    assert all(link["active"] and link["gbps"] == 14.062 for g in gpus for link in g["links"].values())


def test_nvlink_status_inactive_links():
    text = "GPU 0: NVIDIA H200 (UUID: GPU-1)\n\t Link 0: <inactive>\n\t Link 1: 26.562 GB/s\n"
    (g,) = nvsmi.parse_nvlink_status(text)
    assert g["links"][0]["active"] is False and g["links"][0]["gbps"] is None
    assert g["links"][1] == {"active": True, "gbps": 26.562, "raw": "26.562 GB/s"}


def test_nvlink_capabilities_from_seed():
    gpus = nvsmi.parse_nvlink_capabilities((FIXTURES / "nvlink_capabilities.txt").read_text())
    assert len(gpus) == 2
    caps = gpus[0]["links"][2]
    assert caps["P2P is supported"] is True
    assert caps["Link is supported"] is False
    assert len(caps) == 6
    assert all(len(g["links"]) == 4 for g in gpus)


def test_probe_lists_what_it_could_not_record():
    from gpulab import probe

    none = probe.not_recorded({"has_gpus": False, "gpus": [], "topology": None})
    assert {n.reason for n in none} == {"no CUDA GPU visible"}
    assert "PCIe generation and width" in {n.what for n in none}
    full = {"index": 0, "pcie_gen_now": 5, "pcie_width_now": 16, "sm_clock_max_mhz": 1980}
    topo = nvsmi.parse_topology((FIXTURES / "topo_nv4.txt").read_text())
    assert probe.not_recorded({"has_gpus": True, "gpus": [full], "topology": topo}) == []
    no_nvml = probe.not_recorded({"has_gpus": True, "gpus": [{"index": 0}, full], "topology": None})
    assert [n.what for n in no_nvml] == [probe._NVML_FIELDS["pcie_gen_now"], probe._NVML_FIELDS["sm_clock_max_mhz"],
                                         "topology (nvidia-smi topo -m)"]
    assert "GPU(s) 0 " in no_nvml[0].reason
