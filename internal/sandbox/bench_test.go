package sandbox_test

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
)

// BenchmarkBoot measures boot-to-first-exec latency of the bwrap provider
// (overlay mount, cgroups, bwrap + init start, then Exec of /bin/true) beside
// the cheapest possible isolation baseline, `chroot ROOTFS /bin/true`, in the
// same run. Each op boots KILN_BENCH_BOOTS sandboxes one after another (100,
// or 5 with -short) and reports p50/p99 of both and their p50 ratio; the goal
// is a bwrap p50 of 50 ms or less.
func BenchmarkBoot(b *testing.B) {
	root := sandboxtest.Require(b)
	n := 100
	if testing.Short() {
		n = 5
	}
	if v, err := strconv.Atoi(os.Getenv("KILN_BENCH_BOOTS")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	var boot, chroot, closeT []time.Duration
	for b.Loop() {
		for range n {
			start := time.Now()
			sb, err := sandbox.Boot(ctx, sandbox.Options{Rootfs: root, HelperPath: helper})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := sb.Exec(ctx, sandbox.Cmd{Argv: []string{"/bin/true"}, Check: true}); err != nil {
				b.Fatal(err)
			}
			boot = append(boot, time.Since(start))
			start = time.Now()
			if err := sb.Close(); err != nil {
				b.Fatal(err)
			}
			closeT = append(closeT, time.Since(start))

			start = time.Now()
			if out, err := exec.Command("chroot", root, "/bin/true").CombinedOutput(); err != nil {
				b.Fatalf("chroot: %v: %s", err, out)
			}
			chroot = append(chroot, time.Since(start))
		}
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	bp50, bp99 := pct(boot, 50), pct(boot, 99)
	cp50, cp99 := pct(chroot, 50), pct(chroot, 99)
	b.ReportMetric(ms(bp50), "boot-p50-ms")
	b.ReportMetric(ms(bp99), "boot-p99-ms")
	b.ReportMetric(ms(cp50), "chroot-p50-ms")
	b.ReportMetric(ms(cp99), "chroot-p99-ms")
	b.ReportMetric(ms(pct(closeT, 50)), "close-p50-ms")
	b.ReportMetric(float64(bp50)/float64(cp50), "boot/chroot-p50")
}

// pct is the p-th percentile (nearest rank) of ds.
func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p+99)/100 - 1
	return s[max(0, min(i, len(s)-1))]
}

// BenchmarkBootLowers measures boot-to-first-exec of the bwrap provider on
// the base rootfs as one lower (a whole-rootfs bundle) and on a layered
// bundle of 20 lowers over it (twentyLayers), alternating one boot of each
// so that load on the machine hits both alike. Each op boots
// KILN_BENCH_BOOTS of each (50, or 3 with -short) and reports both p50s and
// their ratio (the goal: 20 lowers within noise of 1).
func BenchmarkBootLowers(b *testing.B) {
	root := sandboxtest.Require(b)
	n := 50
	if testing.Short() {
		n = 3
	}
	if v, err := strconv.Atoi(os.Getenv("KILN_BENCH_BOOTS")); err == nil && v > 0 {
		n = v
	}
	layered := layeredBundle(b, root, 20, twentyLayers(b))
	ctx := context.Background()
	boot := func(rootfs string) time.Duration {
		start := time.Now()
		sb, err := sandbox.Boot(ctx, sandbox.Options{Rootfs: rootfs, HelperPath: helper})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := sb.Exec(ctx, sandbox.Cmd{Argv: []string{"/bin/true"}, Check: true}); err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		if err := sb.Close(); err != nil {
			b.Fatal(err)
		}
		return d
	}
	var one, twenty []time.Duration
	for b.Loop() {
		for range n {
			one = append(one, boot(root))
			twenty = append(twenty, boot(layered))
		}
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	p1, p20 := pct(one, 50), pct(twenty, 50)
	b.ReportMetric(ms(p1), "boot1-p50-ms")
	b.ReportMetric(ms(p20), "boot20-p50-ms")
	b.ReportMetric(ms(pct(one, 99)), "boot1-p99-ms")
	b.ReportMetric(ms(pct(twenty, 99)), "boot20-p99-ms")
	b.ReportMetric(float64(p20)/float64(p1), "boot20/boot1-p50")
}
