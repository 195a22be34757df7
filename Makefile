# modelcache: modelcached (the daemon) and modelctl (its CLI).
GO       ?= go
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.version=$(VERSION)
ROOT     ?= ./.modelcache
BIN      := bin

.PHONY: build run test test-short bench bench-store bench-peer bench-daemon bench-fanout bench-fleet bench-pull bench-xet fmt vet clean deb fuzz image bundle need-image

# Debian's versions must start with a digit: 0.1.0~git<commit> unless tagged.
DEB_VERSION ?= $(shell v=$$(git describe --tags --exact-match 2>/dev/null | sed 's/^v//'); [ -n "$$v" ] && echo $$v || echo 0.1.0~git$$(git rev-parse --short HEAD 2>/dev/null || echo 0))

build:
	$(GO) build -trimpath -buildmode=pie -ldflags '$(LDFLAGS)' -o $(BIN)/modelcached ./cmd/modelcached
	$(GO) build -trimpath -buildmode=pie -ldflags '$(LDFLAGS)' -o $(BIN)/modelctl ./cmd/modelctl

# The daemon on an embedded default: a local root, no cluster, no root privileges needed.
run: build
	mkdir -p $(ROOT)/models.d
	$(BIN)/modelcached --root $(ROOT) --socket $(ROOT)/modelcached.sock \
		--metrics-addr 127.0.0.1:9477 --models-dir $(ROOT)/models.d --socket-group ""

# Every test, the race detector on, vet first; then each fuzz target for
# a few seconds beyond its seed corpus (make fuzz runs them longer).
test: vet
	$(GO) test -race -count=1 -timeout 20m ./...
	$(MAKE) --no-print-directory fuzz FUZZTIME=3s

# Fuzz targets (package:Target); seeds are in the tests and testdata/fuzz.
FUZZ_TARGETS := cachestore:FuzzValidatePath cachestore:FuzzValidateName cachestore:FuzzIndexRecords fetchers:FuzzUntar fetchers:FuzzRedact \
	fetchers/hf:FuzzParseURI fetchers/hf:FuzzTreeJSON fetchers/hf/xet:FuzzChunkReader gpu:FuzzParseManifest daemon:FuzzPullRequest daemon/sources:FuzzCredentialsFile
FUZZTIME ?= 2m
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t#*:}; \
		echo "fuzz $$pkg $$name ($(FUZZTIME))"; \
		$(GO) test ./$$pkg -list "^$$name\$$" | grep -qx "$$name" || { echo "fuzz: no $$name in ./$$pkg (FUZZ_TARGETS)"; exit 1; }; \
		log=$$(mktemp); \
		$(GO) test ./$$pkg -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) >$$log 2>&1 || \
		{ tail -40 $$log; echo "fuzz $$pkg $$name failed; once more (an input it found is replayed first and fails again)"; \
		  $(GO) test ./$$pkg -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) >$$log 2>&1; } || \
			{ tail -40 $$log; exit 1; }; \
		rm -f $$log; \
	done

test-short:
	$(GO) test -count=1 -short ./...

vet:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# Benchmarks (docs/benchmarks.md): make bench runs every Go benchmark of the tree, then
# bench/pullbench against curl, crane and the other peers; each bench-* target runs one part alone.
# warm/ and daemon/'s BenchmarkWarmCSI read WARM_BENCH_MIB, WARM_BENCH_DELAY and WARM_BENCH_PULL_MIB.
# daemon/'s BenchmarkFanOut reads BENCH_FANOUT_MIB and BENCH_FANOUT_MIBPS.
# k8ssync's BenchmarkFleet (10, 100 and 1,000 node agents against one kube-apiserver) reads FLEET_BENCH_NODES and FLEET_BENCH_PULL.
# test/fanout's BenchmarkFanOutNetns (root: network namespaces) reads FANOUT_BENCH_MIB, FANOUT_BENCH_MIBPS and FANOUT_LOG_DIR.
# fetchers/hf's BenchmarkXetRevision (Xet: a revision with 10% of its tensors changed) reads XET_BENCH_MIB, XET_BENCH_LINK_MIBS (a downlink in MiB/s both paths share; unset: none) and XET_BENCH_RTT_MS (with it, a round trip per request).
# bench/pullbench: BENCH_SIZE_MIB sets the model size (README.md, Benchmarks).
# docs_test.go's TestMakeBenchRunsEveryBenchmark fails when a benchmark is in no bench-* target.
bench: build
	$(MAKE) --no-print-directory bench-store
	$(MAKE) --no-print-directory bench-peer
	$(MAKE) --no-print-directory bench-daemon
	$(MAKE) --no-print-directory bench-fanout
	$(MAKE) --no-print-directory bench-fleet
	$(MAKE) --no-print-directory bench-pull
	$(MAKE) --no-print-directory bench-xet

# The store, the capacity planner and /proc scan, warming.
bench-store:
	$(GO) test -run '^$$' -bench . -benchtime 3x ./cachestore/ ./daemon/capacity/ ./warm/

# One peer transfer; the tier effect of streaming (a third tier's time, streamed over
# stored and forwarded); the authorization index every peer request reads.
bench-peer:
	$(GO) test -run '^$$' -bench 'PeerIngest' -benchtime 8x -count 3 ./peer/
	$(GO) test -run '^$$' -bench 'Tiers' -benchtime 3x ./peer/
	$(GO) test -run '^$$' -bench 'PeerAuthzIndex' -benchmem ./daemon/fanout/

# Warming for a CSI volume, CSI publishes during a compose, fan-out in one process.
bench-daemon:
	$(GO) test -run '^$$' -bench 'WarmCSI' -benchtime 3x ./daemon/
	$(GO) test -run '^$$' -bench 'CSIPublishDuringCompose|FanOut$$' -benchtime 1x ./daemon/

# Fan-out between real processes in network namespaces (root).
bench-fanout: build
	FANOUT_MODELCACHED=$(CURDIR)/$(BIN)/modelcached $(GO) test -run '^$$' -bench FanOutNetns -benchtime 1x -timeout 30m ./test/fanout/

# The sync loops of 10, 100 and 1,000 node agents against one kube-apiserver: what a rollout
# costs the API server per node (docs/fan-out.md: What a node costs the API server); then the
# same fleets with the bytes moving (the fan-out planner, the peer ports, a throttled origin):
# peer requests per node per blob, origin bytes over the model, all Ready over one node alone.
bench-fleet:
	$(GO) test -run '^$$' -bench Fleet -benchtime 1x -timeout 40m ./k8ssync/
	$(GO) test -run '^$$' -bench FleetBytes -benchtime 1x -timeout 60m ./daemon/fanout/

# hf:// over Xet: a 1 GiB model (XET_BENCH_MIB), then a revision with 10% of its tensors
# changed: bytes fetched for it over its size, and both revisions' time against the bridge
# (XET_BENCH_LINK_MIBS=200: through one 200 MiB/s downlink, as a node across a network).
bench-xet:
	$(GO) test -run '^$$' -bench XetRevision -benchtime 1x -timeout 30m ./fetchers/hf/

# Pulls against curl, crane | tar and the other peers (docs/benchmarks.md: The last run).
bench-pull: build
	$(GO) run ./bench/pullbench -bin $(BIN)

# The .deb (dpkg-deb; see packaging/deb/): binaries, units, sysusers and
# tmpfiles, a default config, an empty models.d, completions, man pages.
deb: build
	packaging/deb/build.sh $(BIN) $(DEB_VERSION) $(BIN)

# The daemon image without a container engine (internal/mkimage, with
# go-containerregistry): both binaries on a glibc base of this Debian host's
# libc6 files, as an OCI image archive (docs/install.md: Install on a cluster).
# IMAGE is a required value: the reference your nodes pull, which make
# bundle puts in the DaemonSet (make image bundle IMAGE=registry.example.com/modelcached:v1).
IMAGE_TAR ?= $(BIN)/modelcached.oci.tar
need-image:
	@[ -n "$(IMAGE)" ] || { echo "make: IMAGE is a required value: the reference your nodes pull the daemon from, e.g. make image bundle IMAGE=registry.example.com/modelcached:v1 (docs/install.md, Install on a cluster)" >&2; exit 2; }
image: need-image build
	$(GO) run ./internal/mkimage -out $(IMAGE_TAR) -ref $(IMAGE) -base "$$(dpkg -L libc6)" $(BIN)/modelcached $(BIN)/modelctl

# The DaemonSet bundle (deploy/daemonset, kustomize) and its examples,
# running the image make image built (the same IMAGE), for kubectl apply -f:
# kubectl apply -k deploy/daemonset refuses to render without it.
BUNDLE ?= $(BIN)/modelcache.yaml
EXAMPLES ?= $(BIN)/modelcache-examples.yaml
bundle: need-image
	mkdir -p $(BIN)
	$(GO) run ./internal/mkbundle -image $(IMAGE) -out $(BUNDLE) deploy/daemonset
	$(GO) run ./internal/mkbundle -image $(IMAGE) -out $(EXAMPLES) deploy/daemonset/examples

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN)
