// Registers an AMBROSIA instance in Azure storage (Azurite) the way the binding reads it at
// start-up: the blob cra/AmbrosiaBinaries/<instance>-<instance>0 (its registration, an
// AmbrosiaRuntimeParams XML with the IC's two ports and log folder) and the CRA connection
// table. Run: node seed.js AZURE_STORAGE_PACKAGE INSTANCE RECEIVE_PORT SEND_PORT LOG_FOLDER
// with AZURE_STORAGE_CONN_STRING set.
"use strict";
const [pkg, instance, receivePort, sendPort, logFolder] = process.argv.slice(2);
const azure = require(pkg);
const conn = process.env.AZURE_STORAGE_CONN_STRING;

const xml =
    "<AmbrosiaRuntimeParams>" +
    `<serviceReceiveFromPort>${receivePort}</serviceReceiveFromPort>` +
    `<serviceSendToPort>${sendPort}</serviceSendToPort>` +
    `<serviceName>${instance}</serviceName>` +
    `<serviceLogPath>${logFolder}</serviceLogPath>` +
    "<createService>A</createService><pauseAtStart>false</pauseAtStart>" +
    "<persistLogs>true</persistLogs><activeActive>false</activeActive>" +
    "<logTriggerSizeMB>1024</logTriggerSizeMB>" +
    "<storageConnectionString>redacted</storageConnectionString>" +
    "<currentVersion>0</currentVersion><upgradeToVersion>0</upgradeToVersion>" +
    "</AmbrosiaRuntimeParams>";

function done(what) {
    return (error) => {
        if (error) {
            console.error(`seed: ${what}: ${error.message}`);
            process.exit(1);
        }
    };
}

const blobs = azure.createBlobService(conn);
const tables = azure.createTableService(conn);
blobs.createContainerIfNotExists("cra", (error) => {
    done("container cra")(error);
    blobs.createBlockBlobFromText("cra", `AmbrosiaBinaries/${instance}-${instance}0`, xml, (error) => {
        done("registration blob")(error);
        tables.createTableIfNotExists("craconnectiontable", (error) => {
            done("table craconnectiontable")(error);
            console.log("seeded");
        });
    });
});
