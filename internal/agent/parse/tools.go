package parse

import (
	"encoding/json"
	"strings"
	"sync"
)

// Tool is one function the request offers the model, OpenAI
// function-schema shaped: Parameters is the JSON Schema of the arguments
// object ({"type":"object","properties":{...}}). Only the properties' types
// are consulted.
type Tool struct {
	Name       string
	Parameters json.RawMessage
}

// ParamType is what a tool schema says about one parameter, as the
// qwen3_coder converter reads it.
type ParamType struct {
	// Type is the schema type, trimmed and lower-cased ("string",
	// "integer", ...). For an anyOf union or a type list it is the first
	// non-null type; "string" when the schema names no type.
	Type string
	// Nullable is true when the schema admits null ("type":"null", a null
	// member of a type list or of anyOf).
	Nullable bool
}

// ParamTypes returns the declared parameters of t by name. A schema that
// is not an object or has no properties yields an empty map.
func (t Tool) ParamTypes() map[string]ParamType {
	var schema struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if len(t.Parameters) == 0 || json.Unmarshal(t.Parameters, &schema) != nil {
		return map[string]ParamType{}
	}
	out := make(map[string]ParamType, len(schema.Properties))
	for name, raw := range schema.Properties {
		out[name] = propertyType(raw)
	}
	return out
}

func propertyType(raw json.RawMessage) ParamType {
	var prop map[string]json.RawMessage
	if json.Unmarshal(raw, &prop) != nil || prop == nil {
		return ParamType{Type: "string"}
	}
	if t, ok := prop["type"]; ok {
		var s string
		if json.Unmarshal(t, &s) == nil {
			s = strings.ToLower(pyStrip(s))
			return ParamType{Type: s, Nullable: s == "null"}
		}
		var list []json.RawMessage
		if json.Unmarshal(t, &list) == nil {
			// DIVERGENCE (doc.go): a JSON Schema type list is read like
			// anyOf; the reference stringifies the Python list.
			pt := ParamType{Type: "string"}
			picked := false
			for _, e := range list {
				var s string
				if json.Unmarshal(e, &s) != nil {
					continue
				}
				s = strings.ToLower(pyStrip(s))
				if s == "null" {
					pt.Nullable = true
				} else if !picked {
					pt.Type, picked = s, true
				}
			}
			if !picked && pt.Nullable {
				pt.Type = "null"
			}
			return pt
		}
		// Some other JSON value: matches no known type name.
		return ParamType{Type: strings.ToLower(string(t))}
	}
	if a, ok := prop["anyOf"]; ok {
		pt := ParamType{Type: "string"}
		var opts []json.RawMessage
		_ = json.Unmarshal(a, &opts)
		picked := false
		for _, o := range opts {
			var opt map[string]json.RawMessage
			if json.Unmarshal(o, &opt) != nil || opt == nil {
				continue
			}
			t, ok := opt["type"]
			if !ok {
				continue
			}
			var s string
			if json.Unmarshal(t, &s) != nil {
				s = string(t)
			}
			s = strings.ToLower(pyStrip(s))
			if s == "null" {
				pt.Nullable = true
			} else if !picked {
				pt.Type, picked = s, true
			}
		}
		return pt
	}
	return ParamType{Type: "string"}
}

// ToolSet is a request's tool list indexed for parsing: names, and each
// tool's parameter types read from its schema once, when a call first
// names it. An adapter builds one per session's tool list and parses every
// turn's output against it, instead of reading the called tool's schema
// again each turn. Safe for concurrent use.
type ToolSet struct {
	tools []Tool
	names map[string]bool // non-empty names
	mu    sync.Mutex
	props map[string]map[string]ParamType // read-only once stored
}

// NewToolSet indexes tools. The caller must not change them afterwards.
func NewToolSet(tools []Tool) *ToolSet {
	ts := &ToolSet{tools: tools, names: map[string]bool{}, props: map[string]map[string]ParamType{}}
	for _, t := range tools {
		if t.Name != "" {
			ts.names[t.Name] = true
		}
	}
	return ts
}

// properties returns the parameters of the first tool called name (empty
// when there is none), computed once; the map is shared: read-only.
func (ts *ToolSet) properties(name string) map[string]ParamType {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if p, ok := ts.props[name]; ok {
		return p
	}
	p := map[string]ParamType{}
	for _, t := range ts.tools {
		if t.Name == name {
			p = t.ParamTypes()
			break
		}
	}
	ts.props[name] = p
	return p
}

// convertParam types one qwen3_coder parameter value by the schema
// (vLLM Qwen3CoderToolParser._convert_param_value, docs/adapter.md §6.2).
func convertParam(raw, name string, props map[string]ParamType) any {
	pt, ok := props[name]
	if !ok {
		return raw
	}
	low := strings.ToLower(raw)
	isNullWord := low == "null" || low == "none"
	if pt.Nullable && isNullWord {
		return nil
	}
	typ := pt.Type
	switch typ {
	case "string", "str", "text", "varchar", "char", "enum":
		return raw
	}
	if isNullWord {
		return nil
	}
	switch {
	case strings.HasPrefix(typ, "int"), strings.HasPrefix(typ, "uint"),
		strings.HasPrefix(typ, "long"), strings.HasPrefix(typ, "short"),
		strings.HasPrefix(typ, "unsigned"):
		if s, ok := pyIntText(raw); ok {
			return json.Number(s)
		}
		return raw
	case strings.HasPrefix(typ, "num"), strings.HasPrefix(typ, "float"):
		if f, ok := pyFloat(raw); ok {
			return json.Number(floatJSON(f))
		}
		return raw
	case typ == "boolean" || typ == "bool" || typ == "binary":
		return low == "true"
	}
	container := typ == "object" || typ == "array" || typ == "arr" ||
		strings.HasPrefix(typ, "dict") || strings.HasPrefix(typ, "list")
	if container {
		if v, ok := parseJSON(raw, false); ok {
			if s, ok := v.(string); ok {
				if lv, ok := pyLiteral(s); ok {
					return lv
				}
			}
			return v
		}
	}
	v, ok := pyLiteral(raw)
	if !ok {
		return raw
	}
	if s, ok := v.(string); container && ok {
		if lv, ok := pyLiteral(s); ok {
			return lv
		}
	}
	return v
}
