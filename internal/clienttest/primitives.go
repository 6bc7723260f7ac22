package clienttest

var primitiveTests = []test{}
