// Command apidump prints the exported API of the packages of one module, one
// declaration a line, sorted, so that two dumps differ exactly where the
// API changed. .ci/apicheck compares it with the baseline in .ci/api.
//
// Usage: apidump [-dir module-dir] [patterns]  (default ./...)
//
// Printed: exported constants (with their values), variables, functions,
// types (a struct's exported fields, an interface's methods, any other
// type's underlying type) and the exported methods of each named type.
// Internal packages, main packages and tests are left out.
package main

import (
	"flag"
	"fmt"
	"go/types"
	"os"
	"slices"
	"strings"

	"golang.org/x/tools/go/packages"
)

func main() {
	dir := flag.String("dir", ".", "module directory")
	flag.Parse()
	patterns := flag.Args()
	if len(patterns) == 0 {
		patterns = []string{"./..."}
	}
	cfg := &packages.Config{Mode: packages.NeedName | packages.NeedTypes, Dir: *dir}
	pkgs, err := packages.Load(cfg, patterns...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apidump:", err)
		os.Exit(1)
	}
	if packages.PrintErrors(pkgs) > 0 {
		os.Exit(1)
	}
	slices.SortFunc(pkgs, func(a, b *packages.Package) int { return strings.Compare(a.PkgPath, b.PkgPath) })
	for _, p := range pkgs {
		if p.Name == "main" || isInternal(p.PkgPath) {
			continue
		}
		for _, line := range dump(p.Types) {
			fmt.Println(p.PkgPath + ": " + line)
		}
	}
}

func isInternal(path string) bool {
	return strings.HasSuffix(path, "/internal") || strings.Contains(path, "/internal/")
}

// dump returns the package's exported declarations: constants, variables,
// functions and types, each kind sorted by name, a type followed by its
// fields and methods.
func dump(pkg *types.Package) []string {
	q := func(other *types.Package) string {
		if other == pkg {
			return ""
		}
		return other.Path()
	}
	var consts, vars, funcs, typs []string
	scope := pkg.Scope()
	for _, name := range scope.Names() { // sorted
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch obj := obj.(type) {
		case *types.Const:
			consts = append(consts, fmt.Sprintf("const %s %s = %s", name, types.TypeString(obj.Type(), q), obj.Val().ExactString()))
		case *types.Var:
			vars = append(vars, fmt.Sprintf("var %s %s", name, types.TypeString(obj.Type(), q)))
		case *types.Func:
			funcs = append(funcs, "func "+name+strings.TrimPrefix(types.TypeString(obj.Type(), q), "func"))
		case *types.TypeName:
			typs = append(typs, typeLines(obj, q)...)
		}
	}
	return slices.Concat(consts, vars, funcs, typs)
}

// typeLines describes a type: its definition, then its exported fields or
// interface methods, then the exported methods of T and *T.
func typeLines(obj *types.TypeName, q types.Qualifier) []string {
	name := obj.Name()
	if tn, ok := obj.Type().(*types.Named); ok && tn.TypeParams().Len() > 0 {
		var ps []string
		for i := range tn.TypeParams().Len() {
			tp := tn.TypeParams().At(i)
			ps = append(ps, tp.Obj().Name()+" "+types.TypeString(tp.Constraint(), q))
		}
		name += "[" + strings.Join(ps, ", ") + "]"
	}
	if obj.IsAlias() {
		return []string{fmt.Sprintf("type %s = %s", name, types.TypeString(obj.Type(), q))}
	}
	var out []string
	switch u := obj.Type().Underlying().(type) {
	case *types.Struct:
		out = append(out, "type "+name+" struct")
		for f := range u.Fields() {
			if !f.Exported() {
				continue
			}
			if f.Embedded() {
				out = append(out, fmt.Sprintf("type %s struct, embedded %s", name, types.TypeString(f.Type(), q)))
			} else {
				out = append(out, fmt.Sprintf("type %s struct, field %s %s", name, f.Name(), types.TypeString(f.Type(), q)))
			}
		}
	case *types.Interface:
		out = append(out, "type "+name+" interface")
		for i := range u.NumEmbeddeds() {
			out = append(out, fmt.Sprintf("type %s interface, embedded %s", name, types.TypeString(u.EmbeddedType(i), q)))
		}
		for i := range u.NumExplicitMethods() {
			m := u.ExplicitMethod(i)
			out = append(out, fmt.Sprintf("type %s interface, method %s%s", name, m.Name(), strings.TrimPrefix(types.TypeString(m.Type(), q), "func")))
		}
	default:
		out = append(out, fmt.Sprintf("type %s %s", name, types.TypeString(u, q)))
	}
	if _, isIface := obj.Type().Underlying().(*types.Interface); isIface {
		return out
	}
	ms := types.NewMethodSet(types.NewPointer(obj.Type()))
	for m := range ms.Methods() {
		f := m.Obj().(*types.Func)
		if !f.Exported() || len(m.Index()) > 1 { // promoted methods come with their embedded field
			continue
		}
		recv := obj.Name()
		if _, ptr := f.Type().(*types.Signature).Recv().Type().(*types.Pointer); ptr {
			recv = "*" + recv
		}
		out = append(out, fmt.Sprintf("method (%s) %s%s", recv, f.Name(), strings.TrimPrefix(types.TypeString(f.Type(), q), "func")))
	}
	return out
}
