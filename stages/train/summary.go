package train

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// allAdvantagesZero reports whether no segment has a non-zero advantage:
// such a run can teach nothing (every policy-gradient term is 0), which
// kiln-train warns about rather than refuses (a KL or entropy term may
// still be wanted).
func allAdvantagesZero(segs []Segment) bool {
	for _, s := range segs {
		if s.Advantage != 0 {
			return false
		}
	}
	return true
}

// Summary is kiln-train's end-of-run report, printed on stderr: the step
// metrics of the trainer's events and the warnings of a run that taught
// nothing.
type Summary struct {
	Steps []map[string]any // the trainer's step events
	// ZeroAdvantages: every advantage of the input was 0.
	ZeroAdvantages bool
	// Unchanged: the committed weights are byte-identical to the base's
	// (max tensor difference 0).
	Unchanged bool
}

// Lines are the summary's lines: one of metrics, then one per warning.
func (s Summary) Lines() []string {
	num := func(m map[string]any, k string) (float64, bool) {
		v, ok := m[k].(float64)
		return v, ok && !math.IsNaN(v)
	}
	// mean and max of a metric over the steps that report it
	stat := func(k string) (mean, max float64, n int) {
		max = math.Inf(-1)
		for _, m := range s.Steps {
			if v, ok := num(m, k); ok {
				mean += v
				max = math.Max(max, v)
				n++
			}
		}
		if n > 0 {
			mean /= float64(n)
		}
		return mean, max, n
	}
	var b strings.Builder
	n := len(s.Steps)
	tokMean, _, _ := stat("tokens")
	fmt.Fprintf(&b, "train: %d steps, %.0f tokens per step", n, tokMean)
	if n > 0 {
		first, _ := num(s.Steps[0], "loss")
		last, _ := num(s.Steps[n-1], "loss")
		fmt.Fprintf(&b, "; loss %.4g (first) %.4g (last)", first, last)
	}
	if m, _, k := stat("pg_clipfrac"); k > 0 {
		fmt.Fprintf(&b, "; clip fraction %.3g", m)
	}
	if m, mx, k := stat("grad_norm"); k > 0 {
		fmt.Fprintf(&b, "; grad norm %.3g (max %.3g)", m, mx)
	}
	if m, _, k := stat("train_rollout_logprob_abs_diff"); k > 0 {
		fmt.Fprintf(&b, "; logprob difference %.2g", m)
		if _, mx, k := stat("train_rollout_logprob_max_abs_diff"); k > 0 {
			fmt.Fprintf(&b, " (max %.2g)", mx)
		}
	}
	lines := []string{b.String()}
	if s.ZeroAdvantages {
		lines = append(lines, "train: WARNING: every advantage of the input is 0: these steps teach nothing (the same reward for every rollout of each group?)")
	}
	if s.Unchanged {
		lines = append(lines, "train: WARNING: the committed weights equal the base's (max tensor difference 0): no step changed a weight")
	}
	return lines
}

// WeightsUnchanged reports whether every tensor of the checkpoint in out
// is byte-identical to the tensor of the same name in base (same dtype,
// shape and bytes: a max difference of 0), so a committed "trained"
// checkpoint that is a copy of its base is caught. It stops at the first
// tensor that differs, which in a run that learned is the first one
// compared. A tensor missing from base, or of another dtype or shape,
// counts as changed. Both directories hold safetensors files, with an
// index (model.safetensors.index.json) or as one model.safetensors.
func WeightsUnchanged(out, base string) (bool, error) {
	outMap, err := weightMap(out)
	if err != nil {
		return false, err
	}
	baseMap, err := weightMap(base)
	if err != nil {
		return false, err
	}
	names := make([]string, 0, len(outMap))
	for n := range outMap {
		names = append(names, n)
	}
	sort.Strings(names)
	files := map[string]*stFile{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	open := func(dir, shard string) (*stFile, error) {
		p := filepath.Join(dir, shard)
		if f, ok := files[p]; ok {
			return f, nil
		}
		f, err := openST(p)
		if err != nil {
			return nil, err
		}
		files[p] = f
		return f, nil
	}
	for _, n := range names {
		bs, ok := baseMap[n]
		if !ok {
			return false, nil
		}
		of, err := open(out, outMap[n])
		if err != nil {
			return false, err
		}
		bf, err := open(base, bs)
		if err != nil {
			return false, err
		}
		same, err := sameTensor(of, bf, n)
		if err != nil || !same {
			return false, err
		}
	}
	return len(names) > 0, nil
}

// weightMap is a checkpoint directory's tensor name -> shard file.
func weightMap(dir string) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json"))
	if err == nil {
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(b, &idx); err != nil {
			return nil, fmt.Errorf("%s: model.safetensors.index.json: %w", dir, err)
		}
		return idx.WeightMap, nil
	}
	if !os.IsNotExist(err) {
		return nil, err
	}
	f, err := openST(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := map[string]string{}
	for n := range f.header {
		m[n] = "model.safetensors"
	}
	return m, nil
}

// stFile is an open safetensors file and its header.
type stFile struct {
	*os.File
	header map[string]tensorInfo
	data   int64 // where the data section starts
}

func openST(path string) (*stFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	var n uint64
	if err := binary.Read(f, binary.LittleEndian, &n); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: safetensors header length: %w", path, err)
	}
	if n > 100<<20 {
		f.Close()
		return nil, fmt.Errorf("%s: safetensors header of %d bytes", path, n)
	}
	h := make([]byte, n)
	if _, err := io.ReadFull(f, h); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: safetensors header: %w", path, err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(h, &raw); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: safetensors header: %w", path, err)
	}
	st := &stFile{File: f, header: map[string]tensorInfo{}, data: 8 + int64(n)}
	for k, v := range raw {
		if k == "__metadata__" {
			continue
		}
		var ti tensorInfo
		if err := json.Unmarshal(v, &ti); err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: tensor %q: %w", path, k, err)
		}
		st.header[k] = ti
	}
	return st, nil
}

// sameTensor compares tensor name of a and b byte by byte.
func sameTensor(a, b *stFile, name string) (bool, error) {
	ta, ok := a.header[name]
	tb, okb := b.header[name]
	if !ok {
		return false, fmt.Errorf("%s: no tensor %q, which its index names", a.Name(), name)
	}
	if !okb || ta.DType != tb.DType || fmt.Sprint(ta.Shape) != fmt.Sprint(tb.Shape) ||
		ta.DataOffsets[1]-ta.DataOffsets[0] != tb.DataOffsets[1]-tb.DataOffsets[0] {
		return false, nil
	}
	n := ta.DataOffsets[1] - ta.DataOffsets[0]
	ra := io.NewSectionReader(a.File, a.data+ta.DataOffsets[0], n)
	rb := io.NewSectionReader(b.File, b.data+tb.DataOffsets[0], n)
	bufA, bufB := make([]byte, 1<<20), make([]byte, 1<<20)
	for off := int64(0); off < n; {
		k := int(min(int64(len(bufA)), n-off))
		if _, err := io.ReadFull(ra, bufA[:k]); err != nil {
			return false, fmt.Errorf("%s: tensor %q: %w", a.Name(), name, err)
		}
		if _, err := io.ReadFull(rb, bufB[:k]); err != nil {
			return false, fmt.Errorf("%s: tensor %q: %w", b.Name(), name, err)
		}
		if !bytes.Equal(bufA[:k], bufB[:k]) {
			return false, nil
		}
		off += int64(k)
	}
	return true, nil
}
