package train

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
)

// Tensor is one named 1-D tensor of a safetensors file. Data is one of
// []int32, []int64, []uint8 or []float32 (dtypes I32, I64, U8, F32).
type Tensor struct {
	Name string
	Data any
}

func dtypeOf(data any) (dtype string, n, width int, err error) {
	switch d := data.(type) {
	case []int32:
		return "I32", len(d), 4, nil
	case []int64:
		return "I64", len(d), 8, nil
	case []uint8:
		return "U8", len(d), 1, nil
	case []float32:
		return "F32", len(d), 4, nil
	}
	return "", 0, 0, fmt.Errorf("safetensors: unsupported tensor data %T", data)
}

type tensorInfo struct {
	DType       string   `json:"dtype"`
	Shape       []int    `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// WriteSafetensors writes tensors to w in the safetensors format: an
// 8-byte little-endian header length, the JSON header (each tensor's
// dtype, shape and byte range, and "__metadata__" with string values),
// padded with spaces to a multiple of 8 bytes, then the raw little-endian
// data, tensors in name order (the header's order) without gaps.
func WriteSafetensors(w io.Writer, tensors []Tensor, metadata map[string]string) error {
	ts := append([]Tensor(nil), tensors...)
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	header := map[string]any{}
	if len(metadata) > 0 {
		header["__metadata__"] = metadata
	}
	var off int64
	for i, t := range ts {
		if t.Name == "" || t.Name == "__metadata__" || (i > 0 && ts[i-1].Name == t.Name) {
			return fmt.Errorf("safetensors: bad or repeated tensor name %q", t.Name)
		}
		dt, n, width, err := dtypeOf(t.Data)
		if err != nil {
			return err
		}
		size := int64(n * width)
		header[t.Name] = tensorInfo{DType: dt, Shape: []int{n}, DataOffsets: [2]int64{off, off + size}}
		off += size
	}
	h, err := json.Marshal(header)
	if err != nil {
		return err
	}
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(h)))
	bw.Write(lenBuf[:])
	bw.Write(h)
	var b [8]byte
	for _, t := range ts {
		switch d := t.Data.(type) {
		case []int32:
			for _, v := range d {
				binary.LittleEndian.PutUint32(b[:4], uint32(v))
				bw.Write(b[:4])
			}
		case []int64:
			for _, v := range d {
				binary.LittleEndian.PutUint64(b[:], uint64(v))
				bw.Write(b[:])
			}
		case []uint8:
			bw.Write(d)
		case []float32:
			for _, v := range d {
				binary.LittleEndian.PutUint32(b[:4], math.Float32bits(v))
				bw.Write(b[:4])
			}
		}
	}
	return bw.Flush()
}

// writeSafetensorsFile writes the file at path (created, not replaced in
// place: the work directory is private to one run).
func writeSafetensorsFile(path string, tensors []Tensor, metadata map[string]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := WriteSafetensors(f, tensors, metadata); err != nil {
		f.Close()
		return fmt.Errorf("writing %q: %w", path, err)
	}
	return f.Close()
}
