package schema_test

import (
	"errors"
	"fmt"

	"github.com/tensorlane/tensorlane/rdt/schema"
)

// A misspelt key is refused with the field it most likely meant; every
// layer spells a field the same way.
func Example() {
	var cfg struct {
		EncryptData  bool           `json:"encrypt_data"`
		StallTimeout schema.Seconds `json:"stall_timeout"`
	}
	err := schema.Decode([]byte(`{"encrypt_dta": true}`), schema.JSON, &cfg, nil)
	fmt.Println(err, errors.Is(err, schema.ErrUnknownField))

	f, _ := schema.Lookup("stall_timeout")
	fmt.Println(f.Name, f.GoName(), "--"+f.Flag(), f.Default)
	// Output:
	// config field "encrypt_dta": unknown field (did you mean "encrypt_data"?) true
	// stall_timeout StallTimeout --stall-timeout 30s
}
