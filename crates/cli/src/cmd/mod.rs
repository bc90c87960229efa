//! One module per `farmem` subcommand.
