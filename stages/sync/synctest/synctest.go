// Package synctest writes tiny synthetic Hugging Face checkpoints for
// kiln-sync's tests: safetensors shards (1-based
// model-0000i-of-0000n.safetensors with their index, or a lone
// model.safetensors), config.json, a tokenizer, and trainer files that a
// publish must leave out.
package synctest

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
)

// Tensor is one tensor; len(Data) must be product(Shape) × the dtype's
// width for a valid checkpoint (tests break it on purpose).
type Tensor struct {
	Name  string
	DType string
	Shape []int64
	Data  []byte
}

// Model is a checkpoint: its tensors by shard (one shard and Lone: a lone
// model.safetensors without index), and the other files by name.
type Model struct {
	Shards [][]Tensor
	Lone   bool
	Files  map[string][]byte
	// Meta is every shard's __metadata__ (default {"format":"pt"}).
	Meta map[string]string
}

// Tiny is a deterministic model of shards × perShard F32/BF16 tensors of
// about size bytes each, drawn from seed.
func Tiny(seed uint64, shards, perShard, size int) *Model {
	r := rand.New(rand.NewPCG(seed, 1))
	m := &Model{Files: map[string][]byte{
		"config.json":            []byte(`{"architectures":["TinyForCausalLM"],"max_position_embeddings":4096}`),
		"generation_config.json": []byte(`{"do_sample":true}`),
		"tokenizer_config.json":  []byte(`{"chat_template":"{{ messages }}"}`),
		"tokenizer.json":         []byte(`{"version":"1.0"}`),
		// Trainer files and other weight formats: never published.
		"optimizer.pt":       []byte("optimizer state"),
		"trainer_state.json": []byte(`{}`),
		"metrics.jsonl":      []byte("{}\n"),
		"pytorch_model.bin":  []byte("old weights"),
	}}
	for s := range shards {
		var ts []Tensor
		for i := range perShard {
			dt, w := "F32", 4
			if i%2 == 1 {
				dt, w = "BF16", 2
			}
			n := max(size/w, 1)
			data := make([]byte, n*w)
			for j := range data {
				data[j] = byte(r.UintN(256))
			}
			ts = append(ts, Tensor{Name: fmt.Sprintf("model.layers.%d.w%d", s, i), DType: dt, Shape: []int64{int64(n)}, Data: data})
		}
		m.Shards = append(m.Shards, ts)
	}
	return m
}

// Clone is a deep copy.
func (m *Model) Clone() *Model {
	c := &Model{Lone: m.Lone, Files: map[string][]byte{}, Meta: m.Meta}
	for k, v := range m.Files {
		c.Files[k] = append([]byte(nil), v...)
	}
	for _, s := range m.Shards {
		var ts []Tensor
		for _, t := range s {
			t.Shape = append([]int64(nil), t.Shape...)
			t.Data = append([]byte(nil), t.Data...)
			ts = append(ts, t)
		}
		c.Shards = append(c.Shards, ts)
	}
	return c
}

// Tensor returns the named tensor (nil if none), to change in place.
func (m *Model) Tensor(name string) *Tensor {
	for s := range m.Shards {
		for i := range m.Shards[s] {
			if m.Shards[s][i].Name == name {
				return &m.Shards[s][i]
			}
		}
	}
	return nil
}

// Names are the tensors' names in shard order.
func (m *Model) Names() []string {
	var out []string
	for _, s := range m.Shards {
		for _, t := range s {
			out = append(out, t.Name)
		}
	}
	return out
}

// ShardName is shard i's file name (0-based i, 1-based name).
func (m *Model) ShardName(i int) string {
	if m.Lone {
		return "model.safetensors"
	}
	return fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(m.Shards))
}

// Write writes the model into dir (created), replacing what is there.
func (m *Model) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, b := range m.Files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	weightMap := map[string]string{}
	var total int64
	for i, s := range m.Shards {
		b, err := safetensors(s, m.Meta)
		if err != nil {
			return err
		}
		for _, t := range s {
			weightMap[t.Name] = m.ShardName(i)
			total += int64(len(t.Data))
		}
		if err := os.WriteFile(filepath.Join(dir, m.ShardName(i)), b, 0o644); err != nil {
			return err
		}
	}
	if m.Lone {
		return nil
	}
	idx, _ := json.MarshalIndent(map[string]any{"metadata": map[string]any{"total_size": total}, "weight_map": weightMap}, "", "  ")
	return os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), idx, 0o644)
}

// Safetensors encodes tensors as a safetensors file, in the given order,
// with __metadata__ {"format":"pt"}; offsets follow len(Data), whatever
// the shape says.
func Safetensors(ts []Tensor) ([]byte, error) { return safetensors(ts, nil) }

func safetensors(ts []Tensor, meta map[string]string) ([]byte, error) {
	if meta == nil {
		meta = map[string]string{"format": "pt"}
	}
	header := map[string]any{"__metadata__": meta}
	var off int64
	for _, t := range ts {
		shape := t.Shape
		if shape == nil {
			shape = []int64{}
		}
		header[t.Name] = map[string]any{"dtype": t.DType, "shape": shape, "data_offsets": []int64{off, off + int64(len(t.Data))}}
		off += int64(len(t.Data))
	}
	h, err := json.Marshal(header)
	if err != nil {
		return nil, err
	}
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	out = append(out, h...)
	for _, t := range ts {
		out = append(out, t.Data...)
	}
	return out, nil
}

// EngineFiles are the files a publish of m must store: everything but the
// trainer files and other weight formats.
func (m *Model) EngineFiles() []string {
	var out []string
	for name := range m.Files {
		switch name {
		case "optimizer.pt", "trainer_state.json", "metrics.jsonl", "pytorch_model.bin":
		default:
			out = append(out, name)
		}
	}
	for i := range m.Shards {
		out = append(out, m.ShardName(i))
	}
	if !m.Lone {
		out = append(out, "model.safetensors.index.json")
	}
	sort.Strings(out)
	return out
}
