package main

import (
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/amlfs/amlfs/mount"
)

// TestSettingsDeclaredOnce: every keyed field of mount.Config is a flag of
// `amlfs mount`, with help, under a name no other field takes, and a value
// given as the flag, as AMLFS_*, or in a config file lands in that field.
func TestSettingsDeclaredOnce(t *testing.T) {
	def := mount.DefaultConfig()
	seen := map[string]bool{}
	var keys []string
	eachKey(reflect.ValueOf(&def).Elem(), func(key, usage string, f reflect.Value) {
		if seen[key] {
			t.Errorf("key %s declared twice", key)
		}
		if usage == "" {
			t.Errorf("key %s has no usage", key)
		}
		seen[key] = true
		keys = append(keys, key)
	})
	names := map[string]bool{}
	for _, f := range mountCommand().Flags {
		names[f.Names()[0]] = true
	}
	for _, k := range keys {
		if !names[k] {
			t.Errorf("key %s is not a flag of amlfs mount", k)
		}
	}
	// A value for each key, by its field's type.
	sample := func(f reflect.Value) (string, any) {
		switch f.Interface().(type) {
		case string:
			return "s-value", "s-value"
		case bool:
			return "true", true
		case int:
			return "7", 7
		case time.Duration:
			return "3s", 3 * time.Second
		case []string:
			return "one", []string{"one"}
		}
		t.Fatalf("type %s", f.Type())
		return "", nil
	}
	for _, how := range []string{"flag", "env", "file"} {
		t.Run(how, func(t *testing.T) {
			args := []string{"amlfs", "mount"}
			want := map[string]any{}
			yaml := ""
			eachKey(reflect.ValueOf(&def).Elem(), func(key, _ string, f reflect.Value) {
				text, v := sample(f)
				want[key] = v
				switch how {
				case "flag":
					args = append(args, "--"+key+"="+text)
				case "env":
					t.Setenv(envName(key), text)
				case "file":
					switch v.(type) {
					case []string:
						yaml += key + ": [" + text + "]\n"
					case bool, int:
						yaml += key + ": " + text + "\n"
					default:
						yaml += key + ": \"" + text + "\"\n"
					}
				}
			})
			if how == "file" {
				p := t.TempDir() + "/c.yaml"
				if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--config", p)
			}
			var got mount.Config
			cmd := withConfigFile(&cli.Command{Name: "mount", Flags: mountFlags(), Action: func(c *cli.Context) error {
				got = configFrom(c, "/x")
				return nil
			}})
			app := &cli.App{Commands: []*cli.Command{cmd}}
			if err := app.Run(append(args, "/x")); err != nil {
				t.Fatal(err)
			}
			eachKey(reflect.ValueOf(&got).Elem(), func(key, _ string, f reflect.Value) {
				if !reflect.DeepEqual(f.Interface(), want[key]) {
					t.Errorf("%s: %v, want %v", key, f.Interface(), want[key])
				}
			})
		})
	}
}
