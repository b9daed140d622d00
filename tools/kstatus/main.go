// Command kstatus prints what kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status) computes for Kubernetes
// objects: the status Flux's health checks and `kubectl`-style waiters built on kstatus read.
//
//	kstatus [FILE...]      read FILEs ("-" or none: standard input)
//
// Each input holds one or many objects, as JSON (one value or several in a row) or YAML (documents split by
// `---`); a List (kind List or <Kind>List, with items) stands for its items. For each object one JSON line is
// written: its identity, and the Result of status.Compute (status, message, the standard conditions kstatus
// would add). An object kstatus cannot read gets an "error" field instead, and the exit code is then 1.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kjson "k8s.io/apimachinery/pkg/util/json"
	kyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

type line struct {
	Source     string      `json:"source"`
	APIVersion string      `json:"apiVersion,omitempty"`
	Kind       string      `json:"kind,omitempty"`
	Namespace  string      `json:"namespace,omitempty"`
	Name       string      `json:"name,omitempty"`
	Generation int64       `json:"generation,omitempty"`
	Status     string      `json:"status,omitempty"`
	Message    string      `json:"message,omitempty"`
	Conditions []condition `json:"conditions,omitempty"`
	Error      string      `json:"error,omitempty"`
}

// objects decodes every object of r: JSON or YAML, one or many, Lists expanded.
func objects(r io.Reader) ([]map[string]any, error) {
	dec := kyaml.NewYAMLOrJSONDecoder(bufio.NewReader(r), 4096)
	var out []map[string]any
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
		trimmed := strings.TrimSpace(string(raw))
		if trimmed == "" || trimmed == "null" {
			continue // an empty YAML document
		}
		// The apimachinery decoder keeps whole numbers int64, as the API server's objects have them
		// (encoding/json would make them float64, which unstructured's accessors refuse).
		var obj map[string]any
		if err := kjson.Unmarshal(raw, &obj); err != nil {
			return out, fmt.Errorf("not an object: %w", err)
		}
		out = append(out, expand(obj)...)
	}
}

func expand(obj map[string]any) []map[string]any {
	kind, _ := obj["kind"].(string)
	items, isList := obj["items"].([]any)
	if !isList || !strings.HasSuffix(kind, "List") {
		return []map[string]any{obj}
	}
	var out []map[string]any
	for _, item := range items {
		if m, ok := item.(map[string]any); ok {
			out = append(out, expand(m)...)
		}
	}
	return out
}

func compute(source string, obj map[string]any) line {
	u := &unstructured.Unstructured{Object: obj}
	l := line{Source: source, APIVersion: u.GetAPIVersion(), Kind: u.GetKind(), Namespace: u.GetNamespace(),
		Name: u.GetName(), Generation: u.GetGeneration()}
	res, err := status.Compute(u)
	if err != nil {
		l.Error = err.Error()
		return l
	}
	l.Status, l.Message = string(res.Status), res.Message
	for _, c := range res.Conditions {
		l.Conditions = append(l.Conditions, condition{string(c.Type), string(c.Status), c.Reason, c.Message})
	}
	return l
}

func run(args []string, stdin io.Reader, stdout io.Writer) (failed bool, err error) {
	if len(args) == 0 {
		args = []string{"-"}
	}
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	for _, name := range args {
		var r io.Reader = stdin
		if name != "-" {
			f, err := os.Open(name)
			if err != nil {
				return failed, err
			}
			defer f.Close()
			r = f
		}
		objs, err := objects(r)
		for _, obj := range objs {
			l := compute(name, obj)
			failed = failed || l.Error != ""
			if err := enc.Encode(l); err != nil {
				return failed, err
			}
		}
		if err != nil {
			return failed, fmt.Errorf("%s: %w", name, err)
		}
	}
	return failed, nil
}

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "-h" || os.Args[1] == "--help") {
		fmt.Fprintln(os.Stderr, "usage: kstatus [FILE...]   (JSON or YAML objects; none or - reads standard input)")
		return
	}
	failed, err := run(os.Args[1:], os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}
