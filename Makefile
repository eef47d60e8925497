# The two README commands are `make site` and `make test`; everything else here is what they are made of.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
VENV := .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_FORCE_COLOR ?= false
LAB_WORKSTATIONS ?= 2

.PHONY: site test test-fleet test-crash test-driver prereqs prereqs-test venv lab lab-artifacts lab-down lint sanity unit molecule artifacts bench-kv bench-kv-fleet bench-gpu bench-deploy bench-gateway bench-report bench-compare bench-calibrate bench-rollout clean

## site: bring up the embedded lab and run `ansible-playbook site.yml -i inventories/lab` on it
site: lab
	ansible-playbook site.yml -i inventories/lab

## test: the whole test suite (lint, sanity, unit, molecule on lab workstations; tools/test.sh, stage by stage)
test: prereqs-test
	tools/test.sh

# Docker Engine (started), mmdebstrap, and for the tests git and Chromium: installed as root, else the exact commands.
prereqs:
	tools/lab-prereqs.sh
prereqs-test:
	tools/lab-prereqs.sh --test

venv: $(VENV)/.installed
# uv installs the lock (pip took ~60 s here, uv ~3 s), then Python byte-compiles it on every core, leaving out the
# ~100 collections the ansible package bundles beyond galaxy.yml's dependencies (13,600 of its 17,700 files). The
# bytecode matters: where PYTHONDONTWRITEBYTECODE is set (CI's machines) Python never caches what it compiles, and
# without it every ansible-playbook compiled its imports again (the scenarios ran ~20 % slower). --system-certs: the
# machine's CA store, which pip is also told to use here.
UV_VERSION := 0.13.9
$(VENV)/.installed: requirements.txt
	test -x $(VENV)/bin/python || "$$(tools/find-python.sh)" -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	$(VENV)/bin/uv pip install -q --system-certs --python $(VENV)/bin/python -r requirements.txt
	deps=$$($(VENV)/bin/python -c 'import yaml; print("|".join(d.replace(".", "/") for d in yaml.safe_load(open("galaxy.yml"))["dependencies"]))'); \
	  $(VENV)/bin/python -m compileall -q -j 0 -x "ansible_collections/(?!($$deps)/)" \
	  "$$($(VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
	touch $@

# Everything the lab hosts are given: base image, serving image and its tarballs, tiny checkpoint, gateway image, and
# the image store new hosts are seeded from (lab/image_store.py). Cached by content: a second run takes seconds.
# The lab's scripts need only Python's standard library: this runs beside the venv's creation (tools/test.sh).
lab-artifacts:
	python3 lab/labctl.py image
	python3 lab/build_artifacts.py
	python3 lab/build_gateway_image.py
	python3 lab/image_store.py store

lab: prereqs venv lab-artifacts
	python3 lab/labctl.py up --workstations $(LAB_WORKSTATIONS) --seed

artifacts:
	python3 lab/build_artifacts.py

lab-down:
	python3 lab/labctl.py down

lint: venv
	tools/lint.sh

sanity: venv
	tools/sanity.sh

# UNIT_ARGS: pytest's selection (tools/test.sh runs the tests that need the lab share after the lab's artifacts).
# --dist loadfile: a module's tests on one worker, so a module that runs its cases in one batched play (a module-scoped
# fixture) runs it once; with --dist load each worker that drew one of its tests ran it again (45 s twice, measured).
unit: venv
	pytest tests/unit -q -n auto --dist loadfile $(UNIT_ARGS)

# The scenarios of the test command, in order; scenarios joined by '+' run at once in `make test` (tools/test.sh runs
# each as a timed stage). `make molecule` runs them one by one without the other stages, `make test-fleet` the
# fleet scenario (3 workstations + a gateway under a prober, monitored) alone.
export MOLECULE_SCENARIOS := default+gpu_stack+gpu_workstation vllm_server fleet
molecule: venv lab-artifacts
	for scenario in $(subst +, ,$(MOLECULE_SCENARIOS)); do tools/timed.sh molecule-$$scenario molecule test -s $$scenario || exit 1; done

test-fleet: venv lab-artifacts
	molecule test -s fleet

## test-driver: the nvidia_driver role's Debian path with Debian 13's real packages on a Debian 13 lab host: DKMS
# builds the module against Debian's kernel headers, two converges (the second changes nothing), then verify.
# TEST_DRIVER_MODULE=open: the open module, which Debian 13's current kernels do not build (vars/lab_overlay.yml).
# Not in `make test`: ~350 MB from deb.debian.org and a module build (docs/measurements.md has its time).
test-driver: venv
	python3 lab/labctl.py image --suite trixie
	molecule test -s driver_debian

## test-crash: every crash point of the canary's rollout, killed or power-cut, re-run and checked (tests/crash/crash_points.py)
test-crash: venv lab-artifacts
	molecule destroy -s fleet
	molecule create -s fleet && molecule prepare -s fleet && molecule converge -s fleet
	eph=$$(ls -dt "$$HOME"/.ansible/tmp/molecule.*.fleet | head -n 1); status=0; \
	  ANSIBLE_CONFIG=$$eph/ansible.cfg MOLECULE_EPHEMERAL_DIRECTORY=$$eph MOLECULE_SCENARIO_DIRECTORY=$(CURDIR)/molecule/fleet MOLECULE_FILE=$(CURDIR)/molecule/fleet/molecule.yml \
	  python3 tests/crash/crash_points.py -i $$eph/inventory/ansible_inventory.yml \
	  --ansible-playbook $(CURDIR)/$(VENV)/bin/ansible-playbook || status=$$?; \
	  molecule destroy -s fleet; exit $$status

# vllm-wizard 0.2.0 (the comparison) lives in its own venv; --lab adds the live lab server when it runs.
bench-kv: venv
	test -x .cache/wiz/bin/python || ("$$(tools/find-python.sh)" -m venv .cache/wiz && .cache/wiz/bin/pip install -q vllm-wizard==0.2.0)
	python benchmarks/kv_accuracy.py --wizard-python .cache/wiz/bin/python
	python benchmarks/kv_accuracy.py --lab

# Every lab server's deployment record: the plan's KV tokens against what vLLM allocated (after `make site`).
bench-kv-fleet: venv
	python benchmarks/kv_accuracy.py --fleet -i inventories/lab

bench-gpu: venv
	python benchmarks/gpu_modules_speed.py

bench-report: lab
	ansible-playbook playbooks/benchmark.yml -i inventories/lab

# The load the two clients agree on (docs/observability.md): distinct ~700-token prompts, 32-96 output tokens. Stop the
# other lab servers first; each level takes both clients 5 turns.
COMPARE_ARGS ?= --concurrency 1,4,8,16 --num-prompts 32 --waves 4 --rounds 5 --output-len-range-ratio 0.5 --distinct-prompts \
  --prompt-repeat 20
bench-compare: lab
	python3 benchmarks/compare_vllm_bench.py $(COMPARE_ARGS)

# Both clients against benchmarks/stepped_server.py on the lab host (CPUs 1+, port 8111), whose time to first token is
# at most one 3 ms step by construction: what either client reports beyond that is its own.
bench-calibrate: lab
	docker cp benchmarks/stepped_server.py onprem-lab-ws1:/tmp/stepped_server.py
	docker exec -d onprem-lab-ws1 sh -c 'exec taskset -c 1-$$(($$(nproc --all)-1)) python3 /tmp/stepped_server.py --port 8111'
	sleep 1; python3 benchmarks/compare_vllm_bench.py --port 8111 --concurrency 1,4,8,16,32 --waves 8 $(CALIBRATE_ARGS); \
	status=$$?; docker exec onprem-lab-ws1 pkill -f /tmp/stepped_server.py; exit $$status

bench-rollout: venv
	bash benchmarks/rollout_bench.sh

# Two clients through the lab fleet's gateway (the second one limited, in a tight loop) and the gateway's added latency.
bench-gateway: prereqs venv lab-artifacts
	python3 lab/labctl.py up --workstations 3 --gateway --seed
	ansible-playbook site.yml -i inventories/lab
	ansible-playbook benchmarks/gateway_tenancy.yml -i inventories/lab

bench-deploy: lab
	ansible-playbook benchmarks/deploy_gate.yml -i inventories/lab

clean: lab-down
	rm -rf .cache tests/output
