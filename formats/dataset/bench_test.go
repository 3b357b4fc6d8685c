package dataset_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/formats/store/storetest"
)

// benchTokens is the total number of tokens the trajectory benchmark moves:
// KILN_BENCH_TOKENS, default 100M (CI sets a small value).
func benchTokens(b *testing.B) int {
	if s := os.Getenv("KILN_BENCH_TOKENS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(b, err, "KILN_BENCH_TOKENS")
		return n
	}
	return 100_000_000
}

// shardTokens bounds one shard (as a rollout stage would flush).
const shardTokens = 16 << 20

// genSegments makes segments shaped like agent rollouts: a 6k-token prompt
// shared by the rollout's segments, turns of context and sampled output,
// token ids drawn Zipf-like from a 152k vocabulary, sampler logprobs.
func genSegments(total int) [][]records.Trajectory {
	r := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(rand.New(rand.NewPCG(3, 4)), 1.1, 8, 151_999)
	var shards [][]records.Trajectory
	var cur []records.Trajectory
	curTokens, done := 0, 0
	for rollout := int64(0); done < total; rollout++ {
		prompt := make([]int32, 6000)
		for i := range prompt {
			prompt[i] = int32(zipf.Uint64())
		}
		for seg := int32(0); seg < 2 && done < total; seg++ {
			n := min(6100+r.IntN(20000), max(total-done, 7000))
			tokens := make([]int32, n)
			copy(tokens, prompt)
			for i := len(prompt); i < n; i++ {
				tokens[i] = int32(zipf.Uint64())
			}
			resp := n - len(prompt)
			mask := make([]uint8, resp)
			lps := make([]float32, resp)
			for i := 0; i < resp; {
				run := 50 + r.IntN(400) // alternate sampled output and tool context
				sampled := (i/run)%2 == 0 || i == 0
				for j := i; j < min(i+run, resp); j++ {
					if sampled {
						mask[j] = 1
						lps[j] = float32(-math.Abs(r.NormFloat64()) * 0.7)
					}
				}
				i += run
			}
			cur = append(cur, records.Trajectory{RolloutID: rollout, Index: rollout, GroupIndex: rollout / 8, Segment: seg,
				Tokens: tokens, ResponseLength: int32(resp), LossMask: mask, RolloutLogProbs: lps})
			curTokens += n
			done += n
			if curTokens >= shardTokens {
				shards = append(shards, cur)
				cur, curTokens = nil, 0
			}
		}
	}
	if len(cur) > 0 {
		shards = append(shards, cur)
	}
	return shards
}

func encodeSegments(segs []records.Trajectory, opts records.ArrowOptions) func(io.Writer) error {
	return func(w io.Writer) error {
		enc, err := records.NewTrajectoryEncoder(w, opts)
		if err != nil {
			return err
		}
		if err := enc.Write(segs...); err != nil {
			return err
		}
		return enc.Close()
	}
}

// kilnWrite commits the shards as one version and returns it.
func kilnWrite(b *testing.B, st store.Store, name string, shards [][]records.Trajectory) *dataset.Version {
	ctx := context.Background()
	w, err := dataset.NewWriter(ctx, st, dataset.Spec{Name: name, Kind: records.TrajectoriesKind(),
		Identity: dataset.Identity{Stage: "bench", CodeVersion: "1"}})
	require.NoError(b, err)
	for _, segs := range shards {
		_, err := w.WriteShard(ctx, int64(len(segs)), nil, encodeSegments(segs, records.ArrowOptions{}))
		require.NoError(b, err)
	}
	res, err := w.Commit(ctx, nil)
	require.NoError(b, err)
	return res.Version
}

// kilnRead reads every segment back, checksummed and decoded, and returns
// the number of tokens seen.
func kilnRead(b *testing.B, st store.Store, ref dataset.Ref) int {
	ctx := context.Background()
	v, err := dataset.Open(ctx, st, ref)
	require.NoError(b, err)
	n := 0
	require.NoError(b, v.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachTrajectory(data, func(t *records.Trajectory) error {
			n += len(t.Tokens)
			return nil
		})
	}))
	return n
}

// baseline is the unavoidable work on the same bytes: the encoded
// (uncompressed Arrow) buffers of each shard, zstd-compressed in 4 MiB
// chunks at the level kiln uses, sha256-hashed and written with io.Copy;
// then read back, hashed and decompressed.
type baseline struct {
	raw [][]byte // uncompressed Arrow IPC of each shard
	dir string
}

func newBaseline(b *testing.B, shards [][]records.Trajectory) *baseline {
	bl := &baseline{dir: b.TempDir()}
	for _, segs := range shards {
		var buf bytes.Buffer
		require.NoError(b, encodeSegments(segs, records.ArrowOptions{Uncompressed: true})(&buf))
		bl.raw = append(bl.raw, buf.Bytes())
	}
	return bl
}

const chunk = 4 << 20

func (bl *baseline) write(b *testing.B) {
	enc, _ := zstd.NewWriter(nil)
	defer enc.Close()
	var out []byte
	for i, raw := range bl.raw {
		out = out[:0]
		for off := 0; off < len(raw); off += chunk {
			out = enc.EncodeAll(raw[off:min(off+chunk, len(raw))], out)
		}
		sum := sha256.Sum256(out)
		_ = sum
		f, err := os.Create(filepath.Join(bl.dir, fmt.Sprint(i)))
		require.NoError(b, err)
		_, err = io.Copy(f, bytes.NewReader(out))
		require.NoError(b, err)
		require.NoError(b, f.Sync()) // kiln's writes are durable; so are the baseline's
		require.NoError(b, f.Close())
	}
}

func (bl *baseline) read(b *testing.B) {
	dec, _ := zstd.NewReader(nil)
	defer dec.Close()
	var out []byte
	for i, raw := range bl.raw {
		if cap(out) < len(raw) {
			out = make([]byte, 0, len(raw))
		}
		data, err := os.ReadFile(filepath.Join(bl.dir, fmt.Sprint(i)))
		require.NoError(b, err)
		sum := sha256.Sum256(data)
		_ = sum
		out, err = dec.DecodeAll(data, out[:0])
		require.NoError(b, err)
	}
}

func timed(f func()) time.Duration {
	start := time.Now()
	f()
	return time.Since(start)
}

// BenchmarkTrajectoryIO writes and reads trajectory segments through kiln
// datasets and, in the same iteration, the baseline (local) or kiln on the
// local disk (s3), and reports throughput and the ratios.
//
//	go test ./formats/dataset -run '^$' -bench TrajectoryIO -benchtime 1x
func BenchmarkTrajectoryIO(b *testing.B) {
	shards := genSegments(benchTokens(b))
	total := 0
	for _, segs := range shards {
		for _, t := range segs {
			total += len(t.Tokens)
		}
	}
	var rawBytes int64
	bl := newBaseline(b, shards)
	for _, r := range bl.raw {
		rawBytes += int64(len(r))
	}
	mtoks := func(d time.Duration) float64 { return float64(total) / d.Seconds() / 1e6 }
	mbs := func(d time.Duration) float64 { return float64(rawBytes) / d.Seconds() / 1e6 }

	b.Run("local", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			st, err := store.NewLocal(b.TempDir())
			require.NoError(b, err)
			// Interleaved, baseline first, so neither side gets a warmer
			// heap or page cache than the other.
			var v *dataset.Version
			bw := timed(func() { bl.write(b) })
			kw := timed(func() { v = kilnWrite(b, st, "trajectories", shards) })
			br := timed(func() { bl.read(b) })
			kr := timed(func() { require.Equal(b, total, kilnRead(b, st, v.Ref())) })
			b.ReportMetric(mtoks(kw), "write-Mtok/s")
			b.ReportMetric(mbs(kw), "write-MB/s")
			b.ReportMetric(mtoks(kr), "read-Mtok/s")
			b.ReportMetric(mbs(kr), "read-MB/s")
			b.ReportMetric(mtoks(bw), "base-write-Mtok/s")
			b.ReportMetric(mtoks(br), "base-read-Mtok/s")
			b.ReportMetric(kw.Seconds()/bw.Seconds(), "write-x-baseline")
			b.ReportMetric(kr.Seconds()/br.Seconds(), "read-x-baseline")
			b.Logf("%d tokens, %d encoded MB in %d shards, %d compressed MB", total, rawBytes>>20, len(shards), v.Bytes>>20)
		}
	})
	b.Run("s3", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			s3 := storetest.StartVersity(b)
			local, err := store.NewLocal(b.TempDir())
			require.NoError(b, err)
			var v, lv *dataset.Version
			sw := timed(func() { v = kilnWrite(b, s3, "trajectories", shards) })
			sr := timed(func() { require.Equal(b, total, kilnRead(b, s3, v.Ref())) })
			lw := timed(func() { lv = kilnWrite(b, local, "trajectories", shards) })
			lr := timed(func() { require.Equal(b, total, kilnRead(b, local, lv.Ref())) })
			b.ReportMetric(mtoks(sw), "write-Mtok/s")
			b.ReportMetric(mbs(sw), "write-MB/s")
			b.ReportMetric(mtoks(sr), "read-Mtok/s")
			b.ReportMetric(mbs(sr), "read-MB/s")
			b.ReportMetric(sw.Seconds()/lw.Seconds(), "write-x-local")
			b.ReportMetric(sr.Seconds()/lr.Seconds(), "read-x-local")
		}
	})
}
