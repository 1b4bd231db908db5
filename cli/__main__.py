from wallaroo_proto_cli.main import main

main()
