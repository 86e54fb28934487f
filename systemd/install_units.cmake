# Runs at install time (cmake --install, cpack). CMAKE_INSTALL_PREFIX is the final
# prefix; DESTDIR, when set, is a staging root that file(INSTALL) prepends.

set(prefix "${CMAKE_INSTALL_PREFIX}")
string(REGEX REPLACE "/+$" "" prefix "${prefix}")
# As GNUInstallDirs: configuration lives in /etc for the /usr prefix, else under the prefix.
if(prefix STREQUAL "/usr" OR prefix STREQUAL "")
  set(SYSCONFDIR "/etc")
else()
  set(SYSCONFDIR "${prefix}/etc")
endif()
set(BINDIR "${prefix}/${COLIBRI_BINDIR_REL}")
set(DOCDIR "${prefix}/${COLIBRI_DOCDIR_REL}")
set(DATADIR "${prefix}/${COLIBRI_DATADIR_REL}")
set(MDWE "${COLIBRI_UNIT_MDWE}")
set(MDWE_COMMENT "${COLIBRI_UNIT_MDWE_COMMENT}")

# One staging directory per destination: installs to different places may run at once
# (cmake --install and cpack on the same build tree).
string(MD5 destination "$ENV{DESTDIR}|${prefix}")
set(stage "${COLIBRI_UNITS_STAGE_DIR}/${destination}")
file(REMOVE_RECURSE "${stage}")
foreach(unit colibrid.service colibrid.socket colibrid-http.socket)
  configure_file("${COLIBRI_SYSTEMD_SOURCE_DIR}/${unit}.in" "${stage}/system/${unit}" @ONLY)
  configure_file("${COLIBRI_SYSTEMD_SOURCE_DIR}/user/${unit}.in" "${stage}/user/${unit}" @ONLY)
endforeach()
configure_file("${COLIBRI_SYSTEMD_SOURCE_DIR}/colibri.sysusers" "${stage}/sysusers/colibri.conf" COPYONLY)

# The default config: the example with the model the package ships.
file(READ "${COLIBRI_DAEMON_CONFIG_EXAMPLE}" config)
string(REGEX REPLACE "\nmodel = [^\n]*" "\nmodel = ${DATADIR}/colibri/models/default.colibri" config "${config}")
file(WRITE "${stage}/config/colibrid.conf" "${config}")

file(INSTALL "${stage}/system/colibrid.service" "${stage}/system/colibrid.socket" "${stage}/system/colibrid-http.socket"
     DESTINATION "${prefix}/lib/systemd/system" FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
file(INSTALL "${stage}/user/colibrid.service" "${stage}/user/colibrid.socket" "${stage}/user/colibrid-http.socket"
     DESTINATION "${prefix}/lib/systemd/user" FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
file(INSTALL "${stage}/sysusers/colibri.conf"
     DESTINATION "${prefix}/lib/sysusers.d" FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
# Never overwrite a config the administrator may have edited.
if(EXISTS "$ENV{DESTDIR}${SYSCONFDIR}/colibri/colibrid.conf")
  message(STATUS "Keeping: $ENV{DESTDIR}${SYSCONFDIR}/colibri/colibrid.conf (the default is in ${DOCDIR})")
else()
  file(INSTALL "${stage}/config/colibrid.conf"
       DESTINATION "${SYSCONFDIR}/colibri" FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
endif()
file(INSTALL "${stage}/config/colibrid.conf" DESTINATION "${DOCDIR}"
     RENAME colibrid.conf.default FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
file(REMOVE_RECURSE "${stage}")
