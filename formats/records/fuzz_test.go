package records

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"
)

// FuzzReferenceRow: any row kiln accepts comes back from export as equal
// JSON (modulo the documented metadata.instance_id), and through Parquet.
func FuzzReferenceRow(f *testing.F) {
	data, err := os.ReadFile("testdata/reference-rows.jsonl")
	if err != nil {
		f.Fatal(err)
	}
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		f.Add(line)
	}
	f.Add([]byte(`{"prompt": "p", "label": "x", "metadata": {"remote_env_info": {"f2p_script": "s"}}}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		task, err := TaskFromReferenceRow(line, 0)
		if err != nil {
			return
		}
		var buf bytes.Buffer
		enc := NewTaskEncoder(&buf)
		if err := enc.Write(task); err != nil {
			t.Fatalf("accepted row does not encode: %v", err)
		}
		if err := enc.Close(); err != nil {
			t.Fatal(err)
		}
		var back Task
		if err := EachTask(buf.Bytes(), func(t Task) error { back = t; return nil }); err != nil {
			t.Fatal(err)
		}
		row, err := back.ReferenceRow()
		if err != nil {
			t.Fatalf("export: %v", err)
		}
		var want, got map[string]any
		if err := json.Unmarshal(line, &want); err != nil {
			return // duplicate keys and the like: Go's decoder and ours may disagree
		}
		if err := json.Unmarshal(row, &got); err != nil {
			t.Fatalf("export is not JSON: %s", row)
		}
		if md, ok := want["metadata"].(map[string]any); ok {
			if _, has := md["instance_id"]; !has {
				md["instance_id"] = task.TaskID
			}
		} else if want["metadata"] == nil {
			want["metadata"] = map[string]any{"instance_id": task.TaskID}
		}
		if _, has := want["label"]; !has {
			want["label"] = task.TaskID
		}
		w, _ := json.Marshal(want)
		g, _ := json.Marshal(got)
		if !bytes.Equal(w, g) {
			t.Fatalf("round trip differs:\nin:  %s\nout: %s", w, g)
		}
	})
}
